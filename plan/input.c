/* plan/input.c: opening a file to read, the one way every input is opened (plans,
 * safetensors, token files). Only a regular file is opened: the type is checked on the
 * path before open() and again on the descriptor after it, and open() itself never
 * blocks (O_NONBLOCK), so a FIFO with no writer is an error, not a hang, and a device or
 * a directory is named for what it is. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "plan.h"

const char *plan_file_kind(unsigned mode)
{
    mode_t m = (mode_t)mode;
    return S_ISDIR(m)    ? "a directory"
           : S_ISFIFO(m) ? "a FIFO (named pipe)"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISSOCK(m) ? "a socket"
           : S_ISLNK(m)  ? "a symbolic link"
                         : "not a regular file";
}

int plan_open_input(const char *path, int64_t *size, char *err, size_t errlen)
{
    struct stat st;
    if (stat(path, &st)) return plan_fail(err, errlen, "cannot open: %s", strerror(errno));
    if (!S_ISREG(st.st_mode)) return plan_fail(err, errlen, "is %s; give a regular file", plan_file_kind(st.st_mode));
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return plan_fail(err, errlen, "cannot open: %s", strerror(errno));
    int e = fstat(fd, &st) ? errno : 0;
    if (e || !S_ISREG(st.st_mode)) {  // replaced between stat() and open()
        close(fd);
        return e ? plan_fail(err, errlen, "cannot stat: %s", strerror(e))
                 : plan_fail(err, errlen, "is %s; give a regular file", plan_file_kind(st.st_mode));
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    *size = (int64_t)st.st_size;
    return fd;
}

const char *plan_json_why(const char *text, char *buf, size_t n)
{
    const char *near = strstr(text, " near ");
    int len = near ? (int)(near - text) : (int)strlen(text);
    snprintf(buf, n, "%.*s", len, text);
    return buf;
}
