/* runtime/signals.c: SIGINT and SIGTERM in a training run, on each rank.
 *
 * The first stops the run at the next step boundary (every rank agrees on which, step.c),
 * after a checkpoint; one that arrives while a checkpoint is being written lets that save
 * finish and stops right after it (the save has every step so far: no further step, no
 * second save). The second ends the process at once; when it lands in a save, the save
 * is abandoned: its temporary file is removed (plan_output_abandon), its step directory
 * too when nothing else is in it, and one line says so. The process then dies of the
 * signal itself, so a shell sees 128 + its number (130 for SIGINT).
 *
 * One line says that a stop was asked, not one per rank: the rank that speaks is the one
 * the signal was sent to by someone (a user's kill, a terminal), or rank 0 alone when the
 * sender is the rank's parent, mpirun relaying it to every rank. Under `fsexec --nproc`
 * (FSEXEC_LAUNCHER set: launch.c) the launcher is sent the user's signal and relays it
 * through mpirun as SIGUSR1 (SIGINT) or SIGUSR2 (SIGTERM), which mpirun forwards and never
 * takes as a reason to kill the job; the launcher said the line, and reports the exit
 * status. Such a stop is marked RT_SIGNAL_RELAYED in the flag the ranks agree on.
 *
 * Everything a handler does is async-signal-safe: flags, write(2), unlink(2), rmdir(2),
 * raise(3); its lines are formatted before they are needed.
 *
 * A test-only hook, FSEXEC_TEST_SIGNAL=save:N or save:N:twice, makes the signals arrive at
 * a deterministic point (a test must not depend on timing): at the start of the checkpoint
 * after step N, world rank 0 sends SIGINT (to the launcher when there is one, else to
 * itself) and waits until the stop is seen; with :twice, a second SIGINT once the save's
 * first temporary file is open. Not for users: it interrupts the run on purpose.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime.h"

static volatile sig_atomic_t stop;    // the signal asked to stop for (| RT_SIGNAL_RELAYED), or 0
static volatile sig_atomic_t saving;  // a checkpoint is being written: `dir`
static int rank0, launched;
static pid_t launcher;
static char dir[4200];
static char said[2][200], gone[4500];  // the lines: stopping after SIGINT / SIGTERM; a save abandoned
static size_t said_len[2], gone_len, who_len;

static void say(const char *s, size_t n)
{
    if (write(STDERR_FILENO, s, n) < 0) return;  // nothing to do when stderr is gone
}

static void on_signal(int sig, siginfo_t *info, void *ctx)
{
    (void)ctx;
    int relayed = launched && (sig == SIGUSR1 || sig == SIGUSR2);
    int as = sig == SIGUSR1 ? SIGINT : sig == SIGUSR2 ? SIGTERM : sig;
    if (stop) {  // the second: now
        if (saving) {
            plan_output_abandon();
            rmdir(dir);  // only when nothing else is in it: the other ranks' files stay for prune
            if (rank0 || !launched) say(gone, gone_len);
        }
        signal(as, SIG_DFL);
        raise(as);
        return;
    }
    stop = as | (relayed ? RT_SIGNAL_RELAYED : 0);
    int from_parent = info && info->si_pid == getppid();
    if (!relayed && (rank0 || !from_parent)) say(said[as == SIGTERM], said_len[as == SIGTERM]);
}

/* "WHO: SIG: stopping after this step ..." into said[k]. */
static void prepare(int k, const char *who, const char *sig)
{
    int n = snprintf(said[k], sizeof said[k], "%s: %s: stopping after this step (send it again to stop now)\n", who,
                     sig);
    said_len[k] = n > 0 && (size_t)n < sizeof said[k] ? (size_t)n : 0;
}

volatile sig_atomic_t *rt_signals_catch(const char *who, int rank)
{
    rank0 = rank == 0;
    const char *l = getenv("FSEXEC_LAUNCHER");
    launched = l && *l;
    launcher = launched ? (pid_t)strtol(l, NULL, 10) : 0;
    prepare(0, who, "SIGINT");
    prepare(1, who, "SIGTERM");
    int w = snprintf(gone, sizeof gone, "%s: ", who);
    who_len = w > 0 && (size_t)w < sizeof gone ? (size_t)w : 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_RESTART | SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (launched) {
        sigaction(SIGUSR1, &sa, NULL);
        sigaction(SIGUSR2, &sa, NULL);
    }
    return &stop;
}

int rt_signal_of(int agreed) { return agreed & ~RT_SIGNAL_RELAYED; }
int rt_signal_relayed(int agreed) { return (agreed & RT_SIGNAL_RELAYED) != 0; }

/* Waits, at most 30 s, until `done` says so: a signal sent to the launcher comes back
 * through mpirun. */
static void await(int second)
{
    struct timespec ms = {0, 1000000};
    for (int i = 0; i < 30000 && (second || !stop); i++) nanosleep(&ms, NULL);
}

/* The test hook: which save (0: none) and whether twice; read once. */
static int64_t hook_step = -1;
static int hook_twice;

static void hook_read(void)
{
    if (hook_step >= 0) return;
    hook_step = 0;
    const char *h = getenv("FSEXEC_TEST_SIGNAL");
    long long n;
    char more[16] = "";
    if (h && sscanf(h, "save:%lld:%15s", &n, more) >= 1 && n > 0) hook_step = n, hook_twice = !strcmp(more, "twice");
}

static void send_sigint(int second)
{
    if (launched && launcher > 0) kill(launcher, SIGINT);
    else raise(SIGINT);
    await(second);
}

static void second_signal(void) { send_sigint(1); }

void rt_signals_saving(const char *path, int64_t step)
{
    if (!path) {
        saving = 0;
        plan_output_on_open(NULL);
        return;
    }
    saving = 0;
    snprintf(dir, sizeof dir, "%s", path);
    size_t at = who_len;
    int n = snprintf(gone + at, sizeof gone - at, "the checkpoint after step %" PRId64 " (%s) was being written: "
                     "abandoned, its temporary file removed; the newest complete checkpoint stays\n", step, path);
    gone_len = n > 0 && at + (size_t)n < sizeof gone ? at + (size_t)n : 0;
    saving = 1;
    hook_read();
    if (!rank0 || hook_step != step) return;
    if (hook_twice) plan_output_on_open(second_signal);
    send_sigint(0);
}
