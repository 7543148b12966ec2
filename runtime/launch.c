/* runtime/launch.c: `fsexec --nproc N`'s launcher: mpirun as a child, and the signals a
 * user sends to the run (Ctrl-C) relayed to the ranks so that they stop as one process
 * does (runtime/signals.c).
 *
 * mpirun takes SIGINT and SIGTERM as orders to kill the job: it sends every rank SIGTERM,
 * SIGKILL a second later, and exits 1, so a Ctrl-C reached the ranks as SIGTERM, each said
 * so, and a slow save was cut. So mpirun runs in a process group of its own (a terminal's
 * Ctrl-C reaches this process alone), without stdin (a background group that reads the
 * terminal is stopped), and dies with this process (PR_SET_PDEATHSIG). This process relays
 * SIGINT as SIGUSR1 and SIGTERM as SIGUSR2 to the ranks (mpirun's children, found in
 * /proc; else through mpirun, which forwards both as they are); the ranks know them from
 * FSEXEC_LAUNCHER (this PID, passed on by mpirun's -x), stop after the step and its
 * checkpoint, and exit 0, so that mpirun adds no message of its own. The exit status is
 * then this process's to give: 128 + the signal, as one process stopped by it gives. A
 * second signal is relayed too: the ranks end at once.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "runtime.h"

static volatile sig_atomic_t child, relayed, got;  // mpirun's PID; the first signal relayed (0: none); signals

static void relay(int sig)
{
    if (!child) return;
    if (!relayed) {
        relayed = sig;
        static const char a[] = "fsexec: SIGINT: stopping every rank after this step (send it again to stop now)\n";
        static const char b[] = "fsexec: SIGTERM: stopping every rank after this step (send it again to stop now)\n";
        if (write(STDERR_FILENO, sig == SIGINT ? a : b, (sig == SIGINT ? sizeof a : sizeof b) - 1) < 0) relayed = sig;
    }
    got++;
}

/* The signal to the ranks: mpirun's children (on this machine mpirun is the daemon that
 * started them), straight, so that mpirun prints nothing of it; through mpirun, which
 * forwards SIGUSR1 and SIGUSR2 to every rank, when none is found (/proc unreadable). */
static void to_ranks(pid_t mpirun, int sig)
{
    int sent = 0;
    DIR *d = opendir("/proc");
    for (struct dirent *e; d && (e = readdir(d));) {
        char path[300], buf[512];
        long pid = strtol(e->d_name, NULL, 10);
        if (pid <= 0) continue;
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f) fclose(f);
        buf[n] = 0;
        const char *close = strrchr(buf, ')');  // "pid (comm) state ppid ...": comm may hold spaces
        char state;
        long ppid;
        if (close && sscanf(close + 1, " %c %ld", &state, &ppid) == 2 && ppid == (long)mpirun)
            sent += kill((pid_t)pid, sig) == 0;
    }
    if (d) closedir(d);
    if (!sent) kill(mpirun, sig);
}

int rt_launch_run(const char *const *argv, char *err, size_t errlen)
{
    char me[32];
    snprintf(me, sizeof me, "%ld", (long)getpid());
    setenv("FSEXEC_LAUNCHER", me, 1);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = relay;
    sa.sa_flags = 0;  // waitpid returns (EINTR) to relay it
    sigemptyset(&sa.sa_mask);
    sigset_t block, old;  // held until the child's PID is known, so a signal is never lost
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigprocmask(SIG_BLOCK, &block, &old);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        sigprocmask(SIG_SETMASK, &old, NULL);
        return plan_fail(err, errlen, "cannot start %s: %s", argv[0], strerror(errno));
    }
    if (pid == 0) {
        setpgid(0, 0);
#ifdef __linux__
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() == 1) _exit(1);  // the launcher is gone already
#endif
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        sigprocmask(SIG_SETMASK, &old, NULL);
        execvp(argv[0], (char *const *)argv);
        fprintf(stderr, "fsexec: --nproc: cannot run %s: %s (--nproc starts the ranks with Open MPI's mpirun: install "
                "it (apt install openmpi-bin), point FSEXEC_MPIRUN at one, or start the ranks with your own "
                "launcher)\n", argv[0], strerror(errno));
        _exit(1);
    }
    setpgid(pid, pid);  // both sides: whichever runs first
    child = pid;
    sigprocmask(SIG_SETMASK, &old, NULL);
    int status = 0, done = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        for (; done < got; done++) to_ranks(pid, relayed == SIGINT ? SIGUSR1 : SIGUSR2);
    child = 0;
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    int rc = WEXITSTATUS(status);
    return rc == 0 && relayed ? 128 + relayed : rc;
}
