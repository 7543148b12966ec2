/* runtime/ckfs.c: the file handling of checkpoint directories (declared in ckfs.h).
 *
 * A checkpoint directory is a place others can write to (a shared file system, a
 * directory a job reuses), so nothing in it is trusted to be what its name says. Inside
 * it fsexec reads, writes and removes only regular files and directories, each opened
 * relative to its parent's descriptor with O_NOFOLLOW and checked with fstat after the
 * open: a symbolic link, a device or a FIFO under a checkpoint's names is an error that
 * names the path and what it is, never followed, written into or waited on. Writes make
 * a temporary file with O_EXCL (a link planted under its name makes the open fail) and
 * rename it over the target; rename replaces a directory entry, never what a link points
 * to. Only the directory the user names (--checkpoint-dir, --resume) is followed.
 *
 * Where it sits: under checkpoint.c (saving, pruning, opening) and ckexport.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "checkpoint.h"
#include "report.h"

/* What st_mode is, for messages: "a symbolic link", "a character device", ... */
static const char *kind(mode_t m) { return plan_file_kind((unsigned)m); }

int ckfs_root(const char *path, int create, char *err, size_t errlen)
{
    if (create && mkdir(path, 0777) && errno != EEXIST) return plan_fail(err, errlen, "%s: %s", path, strerror(errno));
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        struct stat st;
        return !stat(path, &st) && !S_ISDIR(st.st_mode)
                   ? plan_fail(err, errlen, "%s is %s, not a directory", path, kind(st.st_mode))
                   : plan_fail(err, errlen, "%s: %s", path, strerror(errno));
    }
    return fd;
}

mode_t ckfs_mode(int at, const char *name)
{
    struct stat st;
    return fstatat(at, name, &st, AT_SYMLINK_NOFOLLOW) ? 0 : st.st_mode;
}

/* The message for name inside at being of mode m where `want` was expected. */
static int not_ours(const char *shown, const char *name, mode_t m, const char *want, char *err, size_t errlen)
{
    return plan_fail(err, errlen, "%s/%s is %s, not %s: fsexec reads, writes and removes only the regular files and "
                     "directories it made in a checkpoint (remove it, or use another directory)", shown, name, kind(m),
                     want);
}

int ckfs_dir(int at, const char *shown, const char *name, int create, int *made, char *err, size_t errlen)
{
    int fresh = create && !mkdirat(at, name, 0777);
    if (create && !fresh && errno != EEXIST) return plan_fail(err, errlen, "%s/%s: %s", shown, name, strerror(errno));
    if (made) *made = fresh;
    int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && !fstat(fd, &st) && S_ISDIR(st.st_mode)) return fd;
    int e = errno;
    if (fd >= 0) close(fd);
    mode_t m = ckfs_mode(at, name);
    if (m && !S_ISDIR(m)) return not_ours(shown, name, m, "a directory", err, errlen);
    return plan_fail(err, errlen, "%s/%s: %s", shown, name, strerror(e));
}

int ckfs_open(int at, const char *shown, const char *name, int64_t *size, char *err, size_t errlen)
{
    int fd = openat(at, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && !fstat(fd, &st) && S_ISREG(st.st_mode)) {
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
        *size = (int64_t)st.st_size;
        return fd;
    }
    int e = errno;
    if (fd >= 0) {  // a device or FIFO opened without blocking: named, never read
        mode_t m = st.st_mode;
        close(fd);
        return not_ours(shown, name, m, "a regular file", err, errlen);
    }
    mode_t m = ckfs_mode(at, name);
    if (m && !S_ISREG(m)) return not_ours(shown, name, m, "a regular file", err, errlen);
    return plan_fail(err, errlen, "%s/%s: cannot open: %s", shown, name, strerror(e));
}

static int write_all(int fd, const PlanChunk *c, int n)
{
    for (int i = 0; i < n; i++)
        for (const uint8_t *p = c[i].data, *end = p + c[i].len; p < end;) {
            ssize_t k = write(fd, p, (size_t)(end - p));
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) return -1;
            p += k;
        }
    return 0;
}

int ckfs_write(int at, const char *shown, const char *name, const PlanChunk *chunks, int n, char *err, size_t errlen)
{
    static unsigned counter;
    char tmp[512];
    int fd = -1;
    for (int tries = 0; fd < 0 && tries < 100; tries++) {
        if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", name, (long)getpid(), counter++) >= sizeof tmp)
            return plan_fail(err, errlen, "%s/%s: name too long", shown, name);
        fd = openat(at, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) return plan_fail(err, errlen, "%s/%s: cannot create it: %s", shown, tmp, strerror(errno));
    char path[PATH_MAX];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", shown, tmp) < sizeof path) plan_output_pending(path);
    const char *failed = write_all(fd, chunks, n) ? "write" : fsync(fd) ? "fsync" : NULL;
    int e = errno;
    if (close(fd) && !failed) failed = "close", e = errno;
    mode_t m = failed ? 0 : ckfs_mode(at, name);
    int rc = 0;
    if (m && !S_ISREG(m)) rc = not_ours(shown, name, m, "a regular file", err, errlen);
    else if (!failed && renameat(at, tmp, at, name)) failed = "rename", e = errno;
    if (failed) rc = plan_fail(err, errlen, "%s/%s: cannot write the file (%s): %s", shown, name, failed, strerror(e));
    if (rc) unlinkat(at, tmp, 0);
    else fsync(at);  // the rename itself survives a crash; a failure here loses nothing
    plan_output_pending(NULL);
    return rc;
}

void ckfs_unlink(int at, const char *name)
{
    if (S_ISREG(ckfs_mode(at, name))) unlinkat(at, name, 0);
}

int ckfs_plain_name(const char *name)
{
    return *name && !strchr(name, '/') && strcmp(name, ".") && strcmp(name, "..");
}

int ckfs_is_temp(const char *entry)
{
    const char *t = strstr(entry, ".tmp.");
    if (!t || t == entry) return 0;
    size_t a = strspn(t + 5, "0123456789");
    if (!a || t[5 + a] != '.') return 0;
    size_t b = strspn(t + 6 + a, "0123456789");
    return b && !t[6 + a + b];
}

int ckfs_room(int at, const char *shown, uint64_t need, char *err, size_t errlen)
{
    struct statvfs v;
    if (fstatvfs(at, &v)) return 0;  // a file system that cannot say: the writes will
    uint64_t unit = v.f_frsize ? v.f_frsize : v.f_bsize, avail = (uint64_t)v.f_bavail;
    uint64_t free_bytes = unit && avail > UINT64_MAX / unit ? UINT64_MAX : avail * unit;
    if (need <= free_bytes) return 0;
    char a[32], b[32];
    return plan_fail(err, errlen, "%s: a checkpoint of this plan takes %s and its file system has %s free (the "
                     "previous checkpoint stays until the next is complete): free some space, or use another "
                     "--checkpoint-dir", shown, report_bytes((int64_t)need, a, sizeof a),
                     report_bytes(free_bytes > INT64_MAX ? INT64_MAX : (int64_t)free_bytes, b, sizeof b));
}
