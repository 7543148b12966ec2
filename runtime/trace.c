/* runtime/trace.c: fsexec --trace, a Chrome / Perfetto trace (JSON trace events) of some
 * steps of a run, every rank's in one file.
 *
 * The backend times each op of a traced step on its stream (RtBackendOps.run_step_timed:
 * the CPU around each kernel call, a collective from its start to when it was seen
 * complete; CUDA with events around each op's work on its stream), in microseconds from
 * the step's call. Here each step is placed on the rank's clock, whose origin every rank
 * takes right after they all agree, before the first traced step; so the ranks' lanes line
 * up to within that agreement's latency (one machine or several: no clock is shared).
 *
 * A lane is a plan stream (compute, collectives, copies), as the schedule pass put the op
 * there, and runs its ops one after the other as a stream does: a span starts no earlier
 * than the one before it on its lane ended (two collectives in flight at once on MPI show
 * one after the other, the second from when the first was seen done). Every op of the
 * program is a span in every traced step, a view one of no length; the spans are whole
 * nanoseconds, so that no two on a lane overlap once printed.
 *
 * At the end every rank sends its spans to rank 0 (rt_comm_gather_bytes), which names them
 * from the whole plan and writes the file: one process per rank ("rank 3 (stage 1, dp 1)"),
 * one thread per lane, an "X" event per op named by op and block ("matmul h.3") with its
 * plan op id, step, phase, micro-batch and .fsm location in its args.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

struct RtTrace {
    const Exec *e;
    int64_t first, last;  // the traced steps, inclusive
    int32_t n_ops;        // of this rank's program
    RtSpan *spans;        // n_ops per traced step
    double *call_at;      // per traced step: when the backend was called (rt_now, seconds)
    int64_t n_steps;      // traced so far
    double origin;        // rt_now() when the ranks agreed, before the first traced step
};

/* One span as it travels to rank 0: its op in the whole plan, on this rank's clock. */
typedef struct {
    int64_t ts, dur;      // ns from the origin
    int32_t op, step;
    int32_t lane;         // PlanStream
    int32_t pad;
} Wire;

RtTrace *rt_trace_new(const Exec *e, int64_t first, int64_t last, char *err, size_t errlen)
{
    RtTrace *t = calloc(1, sizeof *t);
    int32_t n = rt_exec_plan(e)->n_ops;
    int64_t steps = last - first + 1;
    if (t && steps > 0) {
        t->spans = malloc(sizeof *t->spans * (size_t)(steps * n + 1));
        t->call_at = malloc(sizeof *t->call_at * (size_t)steps);
    }
    if (!t || steps <= 0 || !t->spans || !t->call_at) {
        rt_trace_free(t);
        plan_fail(err, errlen, steps <= 0 ? "no steps to trace" : "out of memory for the trace");
        return NULL;
    }
    t->e = e, t->first = first, t->last = last, t->n_ops = n;
    return t;
}

void rt_trace_free(RtTrace *t)
{
    if (!t) return;
    free(t->spans);
    free(t->call_at);
    free(t);
}

RtSpan *rt_trace_step(RtTrace *t, int64_t step)
{
    if (!t || step < t->first || step > t->last) return NULL;
    if (step == t->first) {
        rt_comm_agree(0);
        t->origin = rt_now();
    }
    int64_t i = step - t->first;
    t->n_steps = i + 1;
    t->call_at[i] = rt_now();
    return t->spans + i * t->n_ops;
}

/* This rank's spans, lane by lane one after the other, in whole nanoseconds. */
static Wire *wires(const RtTrace *t, int64_t *n)
{
    const Plan *p = rt_exec_plan(t->e), *whole = rt_exec_whole(t->e);
    int32_t base = whole->programs[whole->n_programs > 1 ? rt_exec_stage(t->e) : 0].first_op;
    Wire *w = malloc(sizeof *w * (size_t)(t->n_steps * t->n_ops + 1));
    if (!w) return NULL;
    for (int64_t s = 0; s < t->n_steps; s++) {
        int64_t free_at[PLAN_STREAM_COUNT] = {0}, call = llround((t->call_at[s] - t->origin) * 1e9);
        for (int32_t k = 0; k < t->n_ops; k++) {
            const RtSpan *sp = &t->spans[s * t->n_ops + k];
            int lane = p->ops[k].stream;
            int64_t start = call + llround(sp->start * 1e3), end = start + llround(sp->dur * 1e3);
            if (start < free_at[lane]) start = free_at[lane];
            if (end < start) end = start;
            free_at[lane] = end;
            w[s * t->n_ops + k] = (Wire){.ts = start, .dur = end - start, .op = base + k,
                                         .step = (int32_t)(t->first + s), .lane = lane};
        }
    }
    *n = t->n_steps * t->n_ops;
    return w;
}

static const char *const LANES[PLAN_STREAM_COUNT] = {"compute", "collectives", "copies"};

/* The metadata events of rank r: its process and its lanes, named and in order. */
static int name_rank(json_t *ev, int r, int dp)
{
    char name[96];
    snprintf(name, sizeof name, "rank %d (stage %d, dp %d)", r, r / dp, r % dp);
    int bad = json_array_append_new(ev, json_pack("{s:s, s:s, s:i, s:{s:s}}", "name", "process_name", "ph", "M", "pid",
                                                  r, "args", "name", name));
    bad |= json_array_append_new(ev, json_pack("{s:s, s:s, s:i, s:{s:i}}", "name", "process_sort_index", "ph", "M",
                                               "pid", r, "args", "sort_index", r));
    for (int l = 0; l < PLAN_STREAM_COUNT; l++) {
        bad |= json_array_append_new(ev, json_pack("{s:s, s:s, s:i, s:i, s:{s:s}}", "name", "thread_name", "ph", "M",
                                                   "pid", r, "tid", l, "args", "name", LANES[l]));
        bad |= json_array_append_new(ev, json_pack("{s:s, s:s, s:i, s:i, s:{s:i}}", "name", "thread_sort_index", "ph",
                                                   "M", "pid", r, "tid", l, "args", "sort_index", l));
    }
    return bad;
}

/* One span as an "X" event, named from the whole plan. */
static json_t *span_event(const Plan *whole, const Wire *w, int r, const char *source)
{
    const PlanOp *o = &whole->ops[w->op];
    char name[160], loc[300];
    const char *block = o->block != PLAN_NONE ? plan_str(whole, whole->blocks[o->block].name) : "";
    snprintf(name, sizeof name, "%s%s%s", plan_str(whole, o->op), block[0] ? " " : "", block);
    json_t *args = json_pack("{s:i, s:i, s:s, s:s}", "op", w->op, "step", w->step, "phase",
                             plan_phase_name(o->phase), "stream", plan_stream_name(o->stream));
    if (args && o->line > 0) {
        snprintf(loc, sizeof loc, "%s:%d:%d", source, o->line, o->col);
        json_object_set_new(args, "source", json_string(loc));
    }
    if (args && o->microbatch != PLAN_NONE) json_object_set_new(args, "microbatch", json_integer(o->microbatch));
    /* ts and dur in µs, exactly the nanoseconds the lanes were laid out in */
    return args ? json_pack("{s:s, s:s, s:s, s:f, s:f, s:i, s:i, s:o}", "name", name, "cat",
                            plan_phase_name(o->phase), "ph", "X", "ts", (double)w->ts / 1e3, "dur",
                            (double)w->dur / 1e3, "pid", r, "tid", w->lane, "args", args)
                : NULL;
}

/* Rank 0: every rank's spans as the trace's JSON text (malloc'ed), or NULL out of memory. */
static char *trace_text(const RtTrace *t, const Wire *all, const int64_t *sizes, int world)
{
    const Plan *whole = rt_exec_whole(t->e);
    const char *source = plan_meta_str(whole, "source", "model.fsm");
    int dp = rt_exec_world(t->e), bad = 0;
    json_t *ev = json_array();
    for (int r = 0; r < world && ev; r++) bad |= name_rank(ev, r, dp);
    for (int64_t r = 0, at = 0; r < world && ev; r++) {
        int64_t n = sizes[r] / (int64_t)sizeof(Wire);
        for (int64_t i = 0; i < n; i++) bad |= json_array_append_new(ev, span_event(whole, &all[at + i], (int)r, source));
        at += n;
    }
    json_t *doc = ev ? json_pack("{s:o, s:s, s:{s:s, s:s, s:I, s:I, s:i}}", "traceEvents", ev, "displayTimeUnit", "ms",
                                 "otherData", "producer", "fsexec --trace", "model",
                                 plan_meta_str(whole, "model", "model"), "first_step", (json_int_t)t->first,
                                 "last_step", (json_int_t)(t->first + t->n_steps - 1), "world", world)
                     : NULL;
    char *text = doc && !bad ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    return text;
}

int rt_trace_write(const RtTrace *t, const char *path, char *err, size_t errlen)
{
    int64_t n = 0;
    Wire *mine = wires(t, &n);
    int world = rt_comm_world();  // 1 without MPI
    int64_t *sizes = malloc(sizeof *sizes * (size_t)world);
    int ok = mine && sizes;
    if (rt_comm_agree(!ok)) {
        free(mine), free(sizes);
        return plan_fail(err, errlen, "out of memory gathering the trace");
    }
    Wire *all = rt_comm_gather_bytes(mine, n * (int64_t)sizeof *mine, sizes);
    free(mine);
    int rc = 0;
    if (rt_comm_rank() == 0) {
        char *text = all ? trace_text(t, all, sizes, world) : NULL;
        if (!text) rc = plan_fail(err, errlen, "out of memory writing the trace");
        size_t len = text ? strlen(text) : 0;
        if (text) text[len] = '\n';  // json_dumps's NUL: a newline in its place
        PlanChunk c = {text, len + 1};
        char why[512];
        if (text && plan_write_atomic(path, &c, 1, why, sizeof why)) rc = plan_fail(err, errlen, "%s: %s", path, why);
        free(text);
    }
    free(all), free(sizes);
    return rc;
}
