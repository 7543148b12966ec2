/* report/memfmt.c: the small formatters every report output shares (sizes with binary
 * units, grouped integers, tensor names, types, where an op comes from) and the parser
 * of --mem-limit sizes. Names come from plans that may come from anywhere: each is
 * cleaned (control and non-ASCII bytes as '?', cut to NAME_MAX_SHOWN with "...") so a
 * hostile plan cannot garble a terminal or the layout.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "report.h"

enum { NAME_MAX_SHOWN = 48 };

const char *report_bytes(int64_t bytes, char *buf, size_t n)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double x = (double)bytes;
    int u = 0;
    while ((x >= 1024 || x <= -1024) && u < 6) x /= 1024, u++;
    if (u == 0)
        snprintf(buf, n, "%" PRId64 " B", bytes);
    else
        snprintf(buf, n, u >= 3 ? "%.2f %s" : "%.1f %s", x, units[u]);
    return buf;
}

const char *report_per_param(double v, char *buf, size_t n)
{
    /* Two decimals hide a sharded category at a large world (2 bytes over 1024 ranks is
     * 0.00195): below 0.1, three significant digits instead. */
    snprintf(buf, n, v != 0 && v < 0.1 && v > -0.1 ? "%.3g" : "%.2f", v);
    return buf;
}

int64_t report_mul_sat(int64_t a, int64_t b)
{
    if (a < 0 || b < 0) return 0;
    return b && a > INT64_MAX / b ? INT64_MAX : a * b;
}

const char *report_grouped(int64_t v, char *buf, size_t n)
{
    char digits[32];
    int len = snprintf(digits, sizeof digits, "%" PRIu64, v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v);
    size_t at = 0;
    if (v < 0 && at + 1 < n) buf[at++] = '-';
    for (int i = 0; i < len && at + 2 < n; i++) {
        if (i && (len - i) % 3 == 0) buf[at++] = ',';
        buf[at++] = digits[i];
    }
    buf[at] = 0;
    return buf;
}

static const struct {
    const char *name;
    double bytes;
} UNITS[] = {
    {"B", 1},     {"KiB", 0x1p10}, {"MiB", 0x1p20}, {"GiB", 0x1p30}, {"TiB", 0x1p40},
    {"KB", 1e3},  {"MB", 1e6},     {"GB", 1e9},     {"TB", 1e12},
};

int report_size_parse(const char *s, int64_t *bytes, char *err, size_t errlen)
{
    static const char accepted[] = "B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000)";
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || !isdigit((unsigned char)*s) || errno || !isfinite(v)) {
        snprintf(err, errlen, "'%s' is not a size: expected a number and a unit, e.g. 80GiB", s);
        return -1;
    }
    while (*end == ' ') end++;
    if (!*end) {
        snprintf(err, errlen, "'%s' has no unit: add one of %s, e.g. %sGiB", s, accepted, s);
        return -1;
    }
    for (size_t i = 0; i < sizeof UNITS / sizeof *UNITS; i++) {
        if (strcasecmp(end, UNITS[i].name)) continue;
        double b = v * UNITS[i].bytes;
        if (b < 1 || b >= 0x1p63) {
            snprintf(err, errlen, "'%s' is out of range (1 B to 8 EiB)", s);
            return -1;
        }
        *bytes = (int64_t)b;
        return 0;
    }
    snprintf(err, errlen, "'%s': unknown unit '%s'; use %s", s, end, accepted);
    return -1;
}

const char *report_clean(const char *s, char *buf, size_t n)
{
    size_t i = 0, len = strlen(s);
    for (; s[i] && i + 1 < n && i < NAME_MAX_SHOWN; i++)
        buf[i] = (unsigned char)s[i] >= 0x20 && (unsigned char)s[i] < 0x7f ? s[i] : '?';
    buf[i] = 0;
    if (len > i && i >= 3) memcpy(buf + i - 3, "...", 3);
    return buf;
}

const char *report_tensor_name(const Plan *p, int32_t id, char *buf, size_t n)
{
    const char *s = plan_str(p, p->tensors[id].name);
    if (*s) return report_clean(s, buf, n);
    snprintf(buf, n, "%%%d", id);
    return buf;
}

const char *report_type(const PlanTensor *t, char *buf, size_t n)
{
    size_t at = (size_t)snprintf(buf, n, "%s[", plan_dtype_name(t->dtype));
    for (int32_t d = 0; d < t->rank && at < n; d++)
        at += (size_t)snprintf(buf + at, n - at, "%s%" PRId64, d ? ", " : "", t->shape[d]);
    if (at < n) snprintf(buf + at, n - at, "]");
    return buf;
}

/* "gpt2.fsm:27:47" (the plan's meta "source"), "line 27:47", or "" without a line. */
static const char *source_loc(const Plan *p, const PlanOp *op, char *buf, size_t n)
{
    char src[64];
    const char *file = plan_meta_str(p, "source", NULL);
    if (op->line <= 0)
        buf[0] = 0;
    else if (file && *file)
        snprintf(buf, n, "%s:%d:%d", report_clean(file, src, sizeof src), op->line, op->col);
    else
        snprintf(buf, n, "line %d:%d", op->line, op->col);
    return buf;
}

const char *report_op_where(const Plan *p, int32_t op, char *buf, size_t n)
{
    if (op < 0 || op >= p->n_ops) {
        snprintf(buf, n, "(no op)");
        return buf;
    }
    const PlanOp *o = &p->ops[op];
    char name[64], loc[96], block[64];
    snprintf(buf, n, "%s (%s)%s%s%s%s", report_clean(plan_str(p, o->op), name, sizeof name), plan_phase_name(o->phase),
             *source_loc(p, o, loc, sizeof loc) ? " " : "", loc, o->block == PLAN_NONE ? "" : ", block ",
             o->block == PLAN_NONE ? "" : report_clean(plan_str(p, p->blocks[o->block].name), block, sizeof block));
    return buf;
}

const char *report_made_by(const Plan *p, int32_t tensor, char *buf, size_t n)
{
    const PlanTensor *t = &p->tensors[tensor];
    if (t->producer == PLAN_NONE) {
        snprintf(buf, n, "(%s)", plan_role_name(t->role));
        return buf;
    }
    const PlanOp *o = &p->ops[t->producer];
    char name[64], block[64];
    int at = snprintf(buf, n, "%s", report_clean(plan_str(p, o->op), name, sizeof name));
    if (o->line > 0 && (size_t)at < n) at += snprintf(buf + at, n - (size_t)at, " %d:%d", o->line, o->col);
    if (o->block != PLAN_NONE && (size_t)at < n)
        snprintf(buf + at, n - (size_t)at, " %s", report_clean(plan_str(p, p->blocks[o->block].name), block, sizeof block));
    return buf;
}

/* The ranks of stage k of dp_world ranks each: "rank 3", "ranks 8-15". */
static const char *ranks_of(int64_t k, int64_t dp_world, char *buf, size_t n)
{
    int64_t first = report_mul_sat(k, dp_world > 1 ? dp_world : 1);
    if (dp_world <= 1)
        snprintf(buf, n, "rank %" PRId64, first);
    else
        snprintf(buf, n, "ranks %" PRId64 "-%" PRId64, first, first + (dp_world - 1));
    return buf;
}

const char *report_ranks(const MemReport *r, char *buf, size_t n) { return ranks_of(r->stage, r->world, buf, n); }

const char *report_stage_ranks(const Plan *p, int32_t k, char *buf, size_t n)
{
    return ranks_of(k, p->programs[k].dp_world, buf, n);
}

static const char *label_of(int64_t k, int64_t n_stages, int64_t dp_world, char *buf, size_t n)
{
    char ranks[64];
    ranks_of(k, dp_world, ranks, sizeof ranks);
    if (n_stages <= 1)
        snprintf(buf, n, "%s", ranks);
    else
        snprintf(buf, n, "stage %" PRId64 " of %" PRId64 " (%s)", k, n_stages, ranks);
    return buf;
}

const char *report_label(const MemReport *r, char *buf, size_t n)
{
    return label_of(r->stage, r->n_stages, r->world, buf, n);
}

const char *report_stage_label(const Plan *p, int32_t k, char *buf, size_t n)
{
    return label_of(k, p->n_programs, p->programs[k].dp_world, buf, n);
}
