/* runtime/progress.c: what a run reports, step by step.
 *
 * On a terminal (stderr is a tty): one line redrawn in place, a bar with the step, loss,
 * throughput and ETA, at most ~20 times a second and always at the last step. Otherwise:
 * plain lines every `log_every` steps (default: every step up to 100 steps, else every
 * 10th) and the last. With a log file: one JSON object per step, every step, floats at
 * full precision (%.9g), flushed line by line so a crash loses at most the current step.
 *
 * Nothing here allocates after rt_progress_new: the step loop stays allocation-free.
 * In a world of several ranks only rank 0 reports: the others pass a NULL Progress, and
 * the numbers rank 0 reports (loss, grad norm, items) are already the global ones.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime.h"

enum { BAR_WIDTH = 24 };

struct Progress {
    ProgressOptions o;
    FILE *log;
    int tty;
    double t0, last_draw;       // seconds, monotonic
    double items, seconds;      // totals since the first step, for the average rate
    int drawn;                  // a bar is on the screen
};

double rt_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double rt_accuracy(const float *logits, const int32_t *y, int64_t B, int64_t K)
{
    if (B <= 0 || K <= 0) return NAN;
    int64_t right = 0;
    for (int64_t b = 0; b < B; b++) {
        const float *row = logits + b * K;
        int64_t best = 0;
        for (int64_t k = 1; k < K; k++)
            if (row[k] > row[best]) best = k;
        right += best == y[b];
    }
    return (double)right / (double)B;
}

Progress *rt_progress_new(const ProgressOptions *o, char *err, size_t errlen)
{
    Progress *p = plan_alloc(sizeof *p);
    if (!p) {
        plan_fail(err, errlen, "out of memory");
        return NULL;
    }
    memset(p, 0, sizeof *p);
    p->o = *o;
    if (!p->o.out) p->o.out = stderr;
    if (!p->o.unit) p->o.unit = "tok";
    if (p->o.log_every <= 0) p->o.log_every = p->o.steps <= 100 ? 1 : 10;
    p->tty = o->tty < 0 ? isatty(fileno(p->o.out)) : o->tty;
    if (o->log_path) {
        p->log = fopen(o->log_path, o->append ? "a" : "w");
        if (!p->log) {
            plan_fail(err, errlen, "%s: %s", o->log_path, strerror(errno));
            plan_dealloc(p);
            return NULL;
        }
    }
    p->t0 = p->last_draw = rt_now();
    p->last_draw -= 1;
    return p;
}

/* "1h02m", "3m05s", "42s" */
static const char *duration(double s, char *buf, size_t n)
{
    long t = s > 0 && s < 1e9 ? (long)(s + 0.5) : 0;
    if (t >= 3600)
        snprintf(buf, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60)
        snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, n, "%lds", t);
    return buf;
}

/* 12345.6 -> "12.3k" */
static const char *rate(double r, char *buf, size_t n)
{
    if (r >= 1e6)
        snprintf(buf, n, "%.2fM", r / 1e6);
    else if (r >= 1e4)
        snprintf(buf, n, "%.1fk", r / 1e3);
    else
        snprintf(buf, n, "%.0f", r);
    return buf;
}

static void draw_bar(Progress *p, const StepStats *s, double per_s)
{
    char bar[BAR_WIDTH + 1], r[32], eta[32];
    int fill = p->o.steps > 0 ? (int)((double)BAR_WIDTH * (double)s->step / (double)p->o.steps) : BAR_WIDTH;
    for (int i = 0; i < BAR_WIDTH; i++) bar[i] = i < fill ? '=' : i == fill ? '>' : ' ';
    bar[BAR_WIDTH] = 0;
    int64_t done = s->step - p->o.start;
    double left = done > 0 ? p->seconds / (double)done * (double)(p->o.steps - s->step) : 0;
    fprintf(p->o.out, "\r[%s] %lld/%lld loss %.4f", bar, (long long)s->step, (long long)p->o.steps, s->loss);
    if (!isnan(s->accuracy)) fprintf(p->o.out, " acc %.3f", s->accuracy);
    fprintf(p->o.out, " | %s %s/s %.*f ms/step | ETA %s\033[K", rate(per_s, r, sizeof r), p->o.unit,
            s->ms < 10 ? 2 : 1, s->ms, duration(left, eta, sizeof eta));
    fflush(p->o.out);
    p->drawn = 1;
}

static void plain_line(Progress *p, const StepStats *s, double per_s)
{
    char r[32];
    fprintf(p->o.out, "step %*lld/%lld | loss %.6f", (int)snprintf(NULL, 0, "%lld", (long long)p->o.steps),
            (long long)s->step, (long long)p->o.steps, s->loss);
    if (!isnan(s->accuracy)) fprintf(p->o.out, " | acc %.3f", s->accuracy);
    if (!isnan(s->lr)) fprintf(p->o.out, " | lr %.3e", s->lr);
    if (!isnan(s->grad_norm)) fprintf(p->o.out, " | norm %.4f", s->grad_norm);
    if (s->has_scale) fprintf(p->o.out, " | scale %g", s->loss_scale);
    fprintf(p->o.out, " | %s %s/s | %.*f ms\n", rate(per_s, r, sizeof r), p->o.unit, s->ms < 10 ? 2 : 1, s->ms);
    fflush(p->o.out);
}

/* JSON has no NaN or infinity: a diverged loss is logged as null. */
static void json_number(FILE *f, const char *key, double v)
{
    if (isfinite(v))
        fprintf(f, ", \"%s\": %.9g", key, v);
    else
        fprintf(f, ", \"%s\": null", key);
}

/* A skipped step or a new loss scale is never silent: a line of its own, always. */
static void scale_event(Progress *p, const StepStats *s)
{
    if (!s->skipped && (!s->has_scale || s->loss_scale == s->scale_before)) return;
    if (p->drawn) fputc('\n', p->o.out), p->drawn = 0;
    if (s->skipped)
        fprintf(p->o.out, "step %lld: gradients overflowed; step skipped, loss scale %g -> %g\n", (long long)s->step,
                s->scale_before, s->loss_scale);
    else
        fprintf(p->o.out, "step %lld: %d steps without overflow; loss scale %g -> %g\n", (long long)s->step, 2000,
                s->scale_before, s->loss_scale);
}

int rt_progress_step(Progress *p, const StepStats *s, char *err, size_t errlen)
{
    if (!p) return 0;
    scale_event(p, s);
    double per_s = s->ms > 0 ? s->items / (s->ms * 1e-3) : 0;
    p->items += s->items, p->seconds += s->ms * 1e-3;
    if (p->log) {
        fprintf(p->log, "{\"step\": %lld", (long long)s->step);
        json_number(p->log, "loss", s->loss);
        json_number(p->log, "lr", s->lr);
        json_number(p->log, "grad_norm", s->grad_norm);
        json_number(p->log, "tokens_per_s", per_s);
        json_number(p->log, "ms", s->ms);
        if (!isnan(s->accuracy)) json_number(p->log, "accuracy", s->accuracy);
        if (s->has_scale) json_number(p->log, "loss_scale", s->loss_scale);
        if (s->skipped) fputs(", \"skipped\": true", p->log);
        if (s->to_host_bytes || s->to_device_bytes)
            fprintf(p->log, ", \"to_host_bytes\": %lld, \"to_device_bytes\": %lld", (long long)s->to_host_bytes,
                    (long long)s->to_device_bytes);
        if (fputs("}\n", p->log) == EOF || fflush(p->log) != 0)
            return plan_fail(err, errlen, "%s: write failed: %s", p->o.log_path, strerror(errno));
    }
    int last = s->step >= p->o.steps;
    if (p->tty) {
        double now = rt_now();
        if (last || now - p->last_draw >= 0.05) {
            draw_bar(p, s, per_s);
            p->last_draw = now;
        }
    } else if (last || s->step % p->o.log_every == 0) {
        plain_line(p, s, per_s);
    }
    return 0;
}

void rt_progress_note(Progress *p, const char *fmt, ...)
{
    if (!p) return;
    if (p->drawn) fputc('\n', p->o.out), p->drawn = 0;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(p->o.out, fmt, ap);
    va_end(ap);
    fputc('\n', p->o.out);
    fflush(p->o.out);
}

int rt_progress_end(Progress *p, char *err, size_t errlen)
{
    if (!p) return 0;
    int rc = 0;
    if (p->drawn) fputc('\n', p->o.out);
    if (p->seconds > 0) {
        char r[32];
        fprintf(p->o.out, "done: %.1f s, %s %s/s on average\n", rt_now() - p->t0,
                rate(p->items / p->seconds, r, sizeof r), p->o.unit);
    }
    if (p->log && fclose(p->log) != 0) rc = plan_fail(err, errlen, "%s: %s", p->o.log_path, strerror(errno));
    plan_dealloc(p);
    return rc;
}
