/* tests/unit/test_progress.c: the terminal bar of runtime/progress.c fitted to the
 * terminal's width. A line one column too long wraps, and then every redraw leaves a line
 * behind: the fitted line is never wider than cols - 1, and what it drops as the window
 * narrows goes in a fixed order (ms/step, rate, the bar, accuracy, ETA), never step or loss.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"
#include "tmpdir.h"

static const ProgressBar BAR = {.step = 1234, .steps = 100000, .loss = 3.14159, .accuracy = 0.5, .per_s = 123456,
                                .ms = 12.5, .eta_s = 3725, .unit = "tok"};

static void fit(const ProgressBar *b, int cols, char *buf, size_t n)
{
    int k = rt_progress_bar_fit(b, cols, buf, n);
    cr_assert_eq(k, (int)strlen(buf), "length %d for '%s'", k, buf);
    cr_assert_leq(k, cols - 1, "%d columns wrap at %d: '%s'", k, cols, buf);
    cr_assert(strstr(buf, "1234/100000 loss 3.1416"), "step and loss always stay: '%s'", buf);
}

Test(progress_bar, width_200_shows_everything)
{
    char buf[512];
    fit(&BAR, 200, buf, sizeof buf);
    cr_assert(buf[0] == '[', "%s", buf);
    cr_assert(strstr(buf, " acc 0.500"), "%s", buf);
    cr_assert(strstr(buf, "123.5k tok/s"), "%s", buf);
    cr_assert(strstr(buf, "12.5 ms/step"), "%s", buf);
    cr_assert(strstr(buf, "ETA 1h02m"), "%s", buf);
    cr_assert_eq(strchr(buf, ']') - buf, 41, "the bar grows to 40 and no more: %s", buf);
}

Test(progress_bar, width_80_keeps_bar_drops_ms)
{
    char buf[512];
    fit(&BAR, 80, buf, sizeof buf);
    cr_assert(buf[0] == '[', "%s", buf);
    cr_assert(strstr(buf, "tok/s"), "%s", buf);
    cr_assert(strstr(buf, "ETA 1h02m"), "%s", buf);
    cr_assert_null(strstr(buf, "ms/step"), "%s", buf);
}

Test(progress_bar, width_40_step_loss_and_eta)
{
    char buf[512];
    fit(&BAR, 40, buf, sizeof buf);
    cr_assert_null(strstr(buf, "tok/s"), "%s", buf);
    cr_assert_null(strstr(buf, "ms/step"), "%s", buf);
    cr_assert(strstr(buf, "ETA"), "%s", buf);
}

Test(progress_bar, narrower_than_the_text_is_cut)
{
    char buf[512];
    int k = rt_progress_bar_fit(&BAR, 10, buf, sizeof buf);
    cr_assert_eq(k, 9);
    cr_assert_str_eq(buf, "1234/1000");
    cr_assert_eq(rt_progress_bar_fit(&BAR, 0, buf, sizeof buf), 0);
}

Test(progress_bar, small_buffer_is_cut_not_overrun)
{
    char buf[16];
    int k = rt_progress_bar_fit(&BAR, 200, buf, sizeof buf);
    cr_assert_eq(k, 15);
    cr_assert_eq(strlen(buf), 15);
}

Test(progress_bar, no_accuracy_no_field)
{
    char buf[512];
    ProgressBar b = BAR;
    b.accuracy = NAN;
    fit(&b, 200, buf, sizeof buf);
    cr_assert_null(strstr(buf, "acc"), "%s", buf);
}

/* The log's rate says what it counts: a classifier's samples are not tokens. */
Test(progress_log, rate_key_names_the_unit, .init = make_tmpdir, .fini = remove_tmpdir)
{
    char err[512], path[300];
    snprintf(path, sizeof path, "%s/log.jsonl", tmpdir);
    const char *units[] = {"tok", "samples"}, *keys[] = {"\"tokens_per_s\": 50000", "\"samples_per_s\": 50000"};
    for (int i = 0; i < 2; i++) {
        FILE *out = fopen("/dev/null", "w");
        ProgressOptions o = {.steps = 1, .log_path = path, .unit = units[i], .tty = 0, .out = out};
        Progress *p = rt_progress_new(&o, err, sizeof err);
        cr_assert_not_null(p, "%s", err);
        StepStats st = {.step = 1, .loss = 1, .lr = 1e-3, .grad_norm = 0.5, .ms = 2, .items = 100, .accuracy = NAN};
        cr_assert_eq(rt_progress_step(p, &st, err, sizeof err), 0, "%s", err);
        cr_assert_eq(rt_progress_end(p, err, sizeof err), 0, "%s", err);
        fclose(out);
        char line[512] = "";
        FILE *f = fopen(path, "r");
        cr_assert(fgets(line, sizeof line, f));
        fclose(f);
        cr_assert(strstr(line, keys[i]), "%s: %s", units[i], line);
    }
}
