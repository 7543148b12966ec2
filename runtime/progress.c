/* runtime/progress.c: what a run reports, step by step.
 *
 * Where: step lines (and the summary and notes between them) go to stdout, so that
 * `fsexec plan | tee log` keeps them; only when stdout and stderr are both a terminal is
 * the bar drawn, on stderr. Diagnostics are not this file's: they go to stderr.
 *
 * Plain lines every `log_every` steps (default: every step up to 100 steps, else every
 * 10th) and the last. On a terminal the same plain lines, and under them one line
 * redrawn in place, a bar with the step, loss, throughput and ETA, at most ~20 times a
 * second and always at the last step, fitted to the terminal's width (a line one column
 * too long wraps, and every redraw then adds a line). With a log file: one JSON object
 * per step, every step, floats at full precision (%.9g), flushed line by line so a crash
 * loses at most the current step.
 *
 * Nothing here allocates after rt_progress_new: the step loop stays allocation-free.
 * In a world of several ranks only rank 0 reports: the others pass a NULL Progress, and
 * the numbers rank 0 reports (loss, grad norm, items) are already the global ones.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "runtime.h"

/* The bar itself grows with the terminal between these; below the least it is dropped. */
enum { BAR_MIN = 10, BAR_MAX = 40, LINE_MAX = 512 };

struct Progress {
    ProgressOptions o;
    FILE *log;
    int tty;
    double t0, last_draw;       // seconds, monotonic
    double items, seconds;      // totals since the first step, for the average rate
    int drawn;                  // a bar is on the screen
    int lm;                     // the unit is tokens: the log says tokens_per_s, else samples_per_s
};

double rt_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int64_t rt_correct(const float *logits, const int32_t *y, int64_t B, int64_t K, int64_t ignore, int64_t *counted)
{
    return rt_correct_of(logits, y, B, K, K, ignore, counted);
}

int64_t rt_correct_of(const float *logits, const int32_t *y, int64_t B, int64_t K, int64_t W, int64_t ignore,
                      int64_t *counted)
{
    int64_t right = 0;
    *counted = 0;
    for (int64_t b = 0; b < B && K > 0 && W > 0 && W <= K; b++) {
        if (y[b] == ignore) continue;
        const float *row = logits + b * K;
        int64_t best = 0;
        for (int64_t k = 1; k < W; k++)
            if (row[k] > row[best]) best = k;
        right += best == y[b];
        ++*counted;
    }
    return right;
}

double rt_accuracy(const float *logits, const int32_t *y, int64_t B, int64_t K)
{
    int64_t counted, right = rt_correct(logits, y, B, K, INT64_MIN, &counted);  // no i32 label is INT64_MIN
    return counted ? (double)right / (double)counted : NAN;
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
    if (!p->o.out) {
        int term = isatty(STDOUT_FILENO) && isatty(STDERR_FILENO);
        p->o.out = term ? stderr : stdout;
        if (p->o.tty < 0) p->o.tty = term;
    }
    if (!p->o.unit) p->o.unit = "tok";
    p->lm = !strcmp(p->o.unit, "tok");
    if (p->o.log_every <= 0) p->o.log_every = p->o.steps <= 100 ? 1 : 10;
    p->tty = p->o.tty < 0 ? isatty(fileno(p->o.out)) : p->o.tty;
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

/* Appends to buf (n > 0 bytes) at *k; *k counts what the whole text would take, even
 * past n, so that a caller can measure a rendering in a buffer too small for it. */
__attribute__((format(printf, 4, 5))) static void put(char *buf, size_t n, int *k, const char *fmt, ...)
{
    size_t at = (size_t)*k < n ? (size_t)*k : n - 1;
    va_list ap;
    va_start(ap, fmt);
    *k += vsnprintf(buf + at, n - at, fmt, ap);
    va_end(ap);
}

enum { F_ACC = 1, F_RATE = 2, F_MS = 4, F_ETA = 8, F_ALL = 15 };

/* One rendering of the bar's line with the given fields and a bar bar_w wide (0: none);
 * its length. */
static int bar_text(char *buf, size_t n, const ProgressBar *b, int bar_w, unsigned fields)
{
    char r[32], eta[32];
    int k = 0;
    if (bar_w > 0) {
        int fill = b->steps > 0 ? (int)((double)bar_w * (double)b->step / (double)b->steps) : bar_w;
        put(buf, n, &k, "[");
        for (int i = 0; i < bar_w; i++) put(buf, n, &k, "%c", i < fill ? '=' : i == fill ? '>' : ' ');
        put(buf, n, &k, "] ");
    }
    put(buf, n, &k, "%lld/%lld loss %.4f", (long long)b->step, (long long)b->steps, b->loss);
    if (fields & F_ACC && !isnan(b->accuracy)) put(buf, n, &k, " acc %.3f", b->accuracy);
    if (fields & (F_RATE | F_MS)) put(buf, n, &k, " |");
    if (fields & F_RATE) put(buf, n, &k, " %s %s/s", rate(b->per_s, r, sizeof r), b->unit ? b->unit : "tok");
    if (fields & F_MS) put(buf, n, &k, " %.*f ms/step", b->ms < 10 ? 2 : 1, b->ms);
    if (fields & F_ETA) put(buf, n, &k, " | ETA %s", duration(b->eta_s, eta, sizeof eta));
    return k;
}

int rt_progress_bar_fit(const ProgressBar *b, int cols, char *buf, size_t n)
{
    /* What goes first as the terminal narrows: ms/step, the rate, the bar (below
     * BAR_MIN it says little), accuracy, the ETA. Step and loss always stay. */
    static const struct { unsigned fields; int bar; } levels[] = {
        {F_ALL, 1}, {F_ACC | F_RATE | F_ETA, 1}, {F_ACC | F_ETA, 1}, {F_ACC | F_ETA, 0}, {F_ETA, 0}, {0, 0}};
    enum { N_LEVELS = sizeof levels / sizeof levels[0] };
    if (n == 0) return 0;
    int room = cols > 1 ? cols - 1 : 0;  // the last column would wrap on some terminals
    int k = -1;
    for (int i = 0; i < N_LEVELS && k < 0; i++) {
        int len = bar_text(buf, n, b, 0, levels[i].fields), bar_w = room - len - 3;  // "[", "] "
        if (levels[i].bar && bar_w >= BAR_MIN)
            k = bar_text(buf, n, b, bar_w < BAR_MAX ? bar_w : BAR_MAX, levels[i].fields);
        else if (!levels[i].bar && len <= room)
            k = len;
    }
    if (k < 0) k = bar_text(buf, n, b, 0, 0);
    if (k > room) k = room;  // a very narrow window: cut
    if ((size_t)k >= n) k = (int)n - 1;
    buf[k] = 0;
    return k;
}

/* The terminal's width: the window's, else $COLUMNS, else 80. */
static int term_cols(FILE *f)
{
    struct winsize ws;
    if (ioctl(fileno(f), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
    const char *c = getenv("COLUMNS");
    long v = c ? strtol(c, NULL, 10) : 0;
    return v > 0 && v < 100000 ? (int)v : 80;
}

/* The bar's line is erased rather than ended, so what comes next takes its place. */
static void clear_bar(Progress *p)
{
    if (p->drawn) fputs("\r\033[K", p->o.out), p->drawn = 0;
}

static void draw_bar(Progress *p, const StepStats *s, double per_s)
{
    char line[LINE_MAX];
    int64_t done = s->step - p->o.start;
    ProgressBar b = {.step = s->step, .steps = p->o.steps, .loss = s->loss, .accuracy = s->accuracy, .per_s = per_s,
                     .ms = s->ms, .unit = p->o.unit,
                     .eta_s = done > 0 ? p->seconds / (double)done * (double)(p->o.steps - s->step) : 0};
    int cols = term_cols(p->o.out);
    rt_progress_bar_fit(&b, cols < LINE_MAX ? cols : LINE_MAX, line, sizeof line);
    fprintf(p->o.out, "\r%s\033[K", line);
    fflush(p->o.out);
    p->drawn = 1;
}

/* An evaluation's figures on a step line, where there was one. */
static void print_val(Progress *p, double loss, double accuracy)
{
    fprintf(p->o.out, " | val_loss %.6f", loss);
    if (!isnan(accuracy)) fprintf(p->o.out, " | val_acc %.3f", accuracy);
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
    if (s->evaluated) print_val(p, s->val_loss, s->val_accuracy);
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
    clear_bar(p);
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
        json_number(p->log, p->lm ? "tokens_per_s" : "samples_per_s", per_s);
        json_number(p->log, "ms", s->ms);
        if (!isnan(s->accuracy)) json_number(p->log, "accuracy", s->accuracy);
        if (s->has_scale) json_number(p->log, "loss_scale", s->loss_scale);
        if (s->skipped) fputs(", \"skipped\": true", p->log);
        if (s->evaluated) json_number(p->log, "val_loss", s->val_loss);
        if (s->evaluated && !isnan(s->val_accuracy)) json_number(p->log, "val_acc", s->val_accuracy);
        if (s->to_host_bytes || s->to_device_bytes)
            fprintf(p->log, ", \"to_host_bytes\": %lld, \"to_device_bytes\": %lld", (long long)s->to_host_bytes,
                    (long long)s->to_device_bytes);
        if (fputs("}\n", p->log) == EOF || fflush(p->log) != 0)
            return plan_fail(err, errlen, "%s: write failed: %s", p->o.log_path, strerror(errno));
    }
    int last = s->step >= p->o.steps, line = last || s->step % p->o.log_every == 0 || s->evaluated;
    if (line) {
        clear_bar(p);
        plain_line(p, s, per_s);
    }
    if (p->tty) {
        double now = rt_now();
        if (line || now - p->last_draw >= 0.05) {
            draw_bar(p, s, per_s);
            p->last_draw = now;
        }
    }
    return 0;
}

int rt_progress_eval(Progress *p, int64_t step, double val_loss, double val_accuracy, char *err, size_t errlen)
{
    if (!p) return 0;
    clear_bar(p);
    fprintf(p->o.out, "step %*lld/%lld", (int)snprintf(NULL, 0, "%lld", (long long)p->o.steps), (long long)step,
            (long long)p->o.steps);
    print_val(p, val_loss, val_accuracy);
    fputc('\n', p->o.out);
    fflush(p->o.out);
    if (!p->log) return 0;
    fprintf(p->log, "{\"step\": %lld", (long long)step);
    json_number(p->log, "val_loss", val_loss);
    if (!isnan(val_accuracy)) json_number(p->log, "val_acc", val_accuracy);
    if (fputs("}\n", p->log) == EOF || fflush(p->log) != 0)
        return plan_fail(err, errlen, "%s: write failed: %s", p->o.log_path, strerror(errno));
    return 0;
}

void rt_progress_note(Progress *p, const char *fmt, ...)
{
    if (!p) return;
    clear_bar(p);
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
