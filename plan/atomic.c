/* plan/atomic.c: writing a file so that a crash, a full disk or a killed process never
 * leaves half of it: the bytes go to a temporary file in the same directory (so the
 * rename cannot cross file systems), are flushed and fsync'ed, and only then renamed
 * over the target; the directory is synced so the rename itself survives a crash.
 * Plans and the runtime's safetensors files both go through here. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "plan.h"

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

/* A failure here loses nothing, so it is not reported. */
static void sync_dir(const char *path)
{
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash)
        strcpy(dir, ".");
    else if (slash == path)
        strcpy(dir, "/");
    else if ((size_t)(slash - path) < sizeof dir)
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    else
        return;
    int fd = open(dir, O_RDONLY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

int plan_write_atomic(const char *path, const PlanChunk *chunks, int n, char *err, size_t errlen)
{
    static unsigned counter;
    char tmp[4096];
    int fd = -1;
    for (int tries = 0; fd < 0 && tries < 100; tries++) {
        if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", path, (long)getpid(), counter++) >= sizeof tmp) {
            snprintf(err, errlen, "path too long");
            return -1;
        }
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
        return -1;
    }
    const char *what = NULL;
    for (int i = 0; i < n && !what; i++)
        if (write_all(fd, chunks[i].data, chunks[i].len)) what = "write";
    if (!what && fsync(fd)) what = "fsync";
    int saved = errno;
    if (close(fd) && !what) what = "close", saved = errno;
    if (!what && rename(tmp, path)) what = "rename", saved = errno;
    if (what) {
        unlink(tmp);
        snprintf(err, errlen, "cannot write the file (%s): %s", what, strerror(saved));
        return -1;
    }
    sync_dir(path);
    return 0;
}
