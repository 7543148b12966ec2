/* plan/atomic.c: writing an output file so that a crash, a full disk or a killed process
 * never leaves half of it: the bytes go to a temporary file in the same directory (so the
 * rename cannot cross file systems), are flushed and fsync'ed, and only then renamed
 * over the target; the directory is synced so the rename itself survives a crash.
 * Plans, the runtime's safetensors files and fsc's HTML page all go through here.
 *
 * What is at the path decides how it is written, and nothing but a regular file is ever
 * replaced:
 *   - nothing, or a regular file: the temporary file and the rename. A symlink to a
 *     regular file is resolved first, so the file it points to is replaced and the link
 *     stays a link (a dangling symlink is replaced by the file).
 *   - a character device or a FIFO (/dev/null, /dev/stdout, a named pipe): the bytes are
 *     written straight into it, with no temporary file and no rename. A FIFO is opened
 *     without blocking, so one with no reader is an error, not a hang.
 *   - a directory, a block device, a socket: refused.
 *
 * Temporary files are named PATH.tmp.PID.N. Before each write the ones of PATH left by a
 * process that no longer runs (killed mid-write) are removed. A writer holds a lock on
 * its temporary file, so one of a process on another machine that shares the directory
 * (whose PID means nothing here) is not removed either.
 *
 * Also here, for the tools: checking at start that an output can be written, and
 * checking at exit that standard output was.
 */
#define _XOPEN_SOURCE 700  // realpath
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "plan.h"

typedef enum { OUT_FILE, OUT_STREAM } OutKind;  // renamed over; written into

static int write_all(int fd, const uint8_t *p, size_t n)
{
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* path's directory into dir ("." for a bare name); path's last component, or NULL when
 * the directory does not fit. */
static const char *dir_of(const char *path, char *dir, size_t n)
{
    const char *slash = strrchr(path, '/');
    int len = !slash ? 1 : slash == path ? 1 : (int)(slash - path);
    if ((size_t)snprintf(dir, n, "%.*s", len, slash ? path : ".") >= n) return NULL;
    return slash ? slash + 1 : path;
}

/* Why nothing can be written at a file of this type, or NULL when it can. */
static const char *refused(mode_t m)
{
    return S_ISDIR(m) || S_ISBLK(m) || S_ISSOCK(m) ? plan_file_kind(m) : NULL;
}

/* How path is written, with the file a rename replaces in target (path, or what its
 * symlink points to) and path's type in *mode (0: nothing there); or -1 with a message. */
static int output_kind(const char *path, char *target, mode_t *mode, char *err, size_t errlen)
{
    struct stat st;
    *mode = 0;
    if (!stat(path, &st)) {
        const char *no = refused(st.st_mode);
        if (no) return plan_fail(err, errlen, "is %s; give a file name", no);
        *mode = st.st_mode;
        if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) return OUT_STREAM;
    }
    if (!*path || path[strlen(path) - 1] == '/') return plan_fail(err, errlen, "is not a file name");
    if (!lstat(path, &st) && S_ISLNK(st.st_mode) && *mode) {
        if (!realpath(path, target)) return plan_fail(err, errlen, "cannot resolve the link: %s", strerror(errno));
        return OUT_FILE;
    }
    if (strlen(path) >= PATH_MAX) return plan_fail(err, errlen, "path too long");
    strcpy(target, path);
    return OUT_FILE;
}

/* The PID of a temporary file's name after its target's name (".tmp.PID.N"), or 0. */
static long temp_pid(const char *s)
{
    static const char digits[] = "0123456789";
    if (strncmp(s, ".tmp.", 5)) return 0;
    size_t a = strspn(s + 5, digits);
    if (!a || a > 9 || s[5 + a] != '.') return 0;
    size_t b = strspn(s + 6 + a, digits);
    if (!b || s[6 + a + b]) return 0;
    return strtol(s + 5, NULL, 10);
}

/* Removes the temporary files of path whose writer is gone: its PID runs no process here
 * and no process holds its lock. A failure only leaves a file behind. */
static void remove_stale(const char *path)
{
    char dir[PATH_MAX];
    const char *base = dir_of(path, dir, sizeof dir);
    DIR *d = base ? opendir(dir) : NULL;
    if (!d) return;
    size_t n = strlen(base);
    for (struct dirent *e; (e = readdir(d));) {
        long pid = strncmp(e->d_name, base, n) ? 0 : temp_pid(e->d_name + n);
        if (pid <= 0 || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) continue;
        struct stat st;
        struct flock lk = {.l_type = F_RDLCK, .l_whence = SEEK_SET};
        if (!fstat(fd, &st) && S_ISREG(st.st_mode) && !fcntl(fd, F_GETLK, &lk) && lk.l_type == F_UNLCK)
            unlinkat(dirfd(d), e->d_name, 0);
        close(fd);
    }
    closedir(d);
}

/* A failure here loses nothing, so it is not reported. */
static void sync_dir(const char *path)
{
    char dir[PATH_MAX];
    int fd = dir_of(path, dir, sizeof dir) ? open(dir, O_RDONLY) : -1;
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

/* The temporary file being written now, for a signal handler that abandons it
 * (plan_output_abandon): set once the file is open, cleared once it is renamed or gone. */
static char pending[PATH_MAX + 32];
static volatile sig_atomic_t has_pending;
static void (*on_open)(void);  // test-only: called once a temporary file is open

void plan_output_on_open(void (*hook)(void)) { on_open = hook; }

void plan_output_abandon(void)
{
    if (has_pending) unlink(pending);
}

void plan_output_pending(const char *tmp)
{
    has_pending = 0;
    if (!tmp) return;
    memcpy(pending, tmp, strlen(tmp) + 1);
    has_pending = 1;
    void (*hook)(void) = on_open;
    on_open = NULL;
    if (hook) hook();
}

struct PlanOutput {
    int fd;
    int stream;                  // a device or FIFO: written into, no rename
    const char *failed;          // the first call that failed ("write"), or NULL
    int saved;                   // its errno
    char target[PATH_MAX], tmp[PATH_MAX + 32];
};

PlanOutput *plan_output_open(const char *path, char *err, size_t errlen)
{
    static unsigned counter;
    PlanOutput *o = plan_alloc(sizeof *o);
    if (!o) {
        plan_fail(err, errlen, "out of memory");
        return NULL;
    }
    memset(o, 0, sizeof *o);
    o->fd = -1;
    mode_t mode;
    int kind = output_kind(path, o->target, &mode, err, errlen);
    if (kind == OUT_STREAM) {
        int fifo = S_ISFIFO(mode);
        o->stream = 1;
        o->fd = open(path, O_WRONLY | O_NOCTTY | O_CLOEXEC | (fifo ? O_NONBLOCK : 0));
        struct stat st;
        if (o->fd < 0 && fifo && errno == ENXIO) plan_fail(err, errlen, "is a FIFO (named pipe) with no reader");
        else if (o->fd < 0) plan_fail(err, errlen, "cannot open: %s", strerror(errno));
        else if (fstat(o->fd, &st) || !(S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)))  // replaced since output_kind
            plan_fail(err, errlen, "changed while it was being opened");
        else {
            if (fifo) fcntl(o->fd, F_SETFL, fcntl(o->fd, F_GETFL) & ~O_NONBLOCK);
            return o;
        }
        kind = -1;
    }
    if (kind < 0) {
        if (o->fd >= 0) close(o->fd);
        plan_dealloc(o);
        return NULL;
    }
    remove_stale(o->target);
    for (int tries = 0; o->fd < 0 && tries < 100; tries++) {
        snprintf(o->tmp, sizeof o->tmp, "%s.tmp.%ld.%u", o->target, (long)getpid(), counter++);
        o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (o->fd < 0 && errno != EEXIST) break;
    }
    if (o->fd < 0) {
        plan_fail(err, errlen, "cannot create %s: %s", o->tmp, strerror(errno));
        plan_dealloc(o);
        return NULL;
    }
    struct flock lk = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    fcntl(o->fd, F_SETLK, &lk);  // without locks (some file systems), the PID alone guards it
    plan_output_pending(o->tmp);
    return o;
}

int plan_output_write(PlanOutput *o, const void *data, size_t len)
{
    if (!o->failed && write_all(o->fd, data, len)) o->failed = "write", o->saved = errno;
    return o->failed ? -1 : 0;
}

void plan_output_abort(PlanOutput *o)
{
    if (!o) return;
    close(o->fd);
    if (!o->stream) unlink(o->tmp);
    if (!o->stream) plan_output_pending(NULL);
    plan_dealloc(o);
}

int plan_output_commit(PlanOutput *o, char *err, size_t errlen)
{
    if (!o->failed && !o->stream && fsync(o->fd)) o->failed = "fsync", o->saved = errno;
    if (close(o->fd) && !o->failed) o->failed = "close", o->saved = errno;
    o->fd = -1;
    if (!o->failed && !o->stream && rename(o->tmp, o->target)) o->failed = "rename", o->saved = errno;
    int rc = 0;
    if (!o->stream) plan_output_pending(NULL);  // renamed, or removed just below
    if (o->failed) {
        if (!o->stream) unlink(o->tmp);
        rc = plan_fail(err, errlen, "cannot write the file (%s): %s", o->failed, strerror(o->saved));
    } else if (!o->stream) {
        sync_dir(o->target);
    }
    plan_dealloc(o);
    return rc;
}

int plan_write_atomic(const char *path, const PlanChunk *chunks, int n, char *err, size_t errlen)
{
    PlanOutput *o = plan_output_open(path, err, errlen);
    if (!o) return -1;
    for (int i = 0; i < n; i++) plan_output_write(o, chunks[i].data, chunks[i].len);
    return plan_output_commit(o, err, errlen);
}

int plan_check_output(const char *path, char *err, size_t errlen)
{
    char target[PATH_MAX], dir[PATH_MAX];
    mode_t mode;
    int kind = output_kind(path, target, &mode, err, errlen);
    if (kind < 0) return -1;
    if (kind == OUT_STREAM) return 0;  // not opened now: a FIFO's reader would see its end
    if (!dir_of(target, dir, sizeof dir)) return plan_fail(err, errlen, "path too long");
    struct stat st;
    if (stat(dir, &st)) return plan_fail(err, errlen, "cannot write in %s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return plan_fail(err, errlen, "cannot write in %s: %s", dir, strerror(ENOTDIR));
    if (access(dir, W_OK | X_OK)) return plan_fail(err, errlen, "cannot write in %s: %s", dir, strerror(errno));
    return 0;
}

void plan_stdout_open(void)
{
    static char buf[1 << 16];
    setvbuf(stdout, buf, isatty(STDOUT_FILENO) ? _IOLBF : _IOFBF, sizeof buf);
}

int plan_stdout_close(char *err, size_t errlen)
{
    int e = fflush(stdout) ? errno : 0;
    if (!e && ferror(stdout))  // a write failed before exit, and its reason is gone
        return plan_fail(err, errlen, "error writing to standard output");
    if (!e && fclose(stdout) && errno != EBADF) e = errno;  // EBADF: closed by the caller, nothing written
    return e ? plan_fail(err, errlen, "error writing to standard output: %s", strerror(e)) : 0;
}
