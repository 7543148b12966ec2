/* runtime/ckdir.c: a checkpoint directory as a whole: its names, what is checked in it
 * before a run writes there (nothing but fsexec's own files and directories under its
 * names, room for a checkpoint), a checkpoint's size from the plan, finding the newest
 * complete checkpoint, and removing old ones (--keep) and what a failed save left.
 *
 *   DIR/step-00000300/                    a directory, never a link
 *   DIR/step-00000300/manifest.json       the commit marker (checkpoint.c)
 *   DIR/step-00000300/rank-00000.safetensors  generation 0's rank files
 *   DIR/step-00000300/rank-00000.1.safetensors  generation 1's: a save over a committed
 *                                         checkpoint of the same step writes the other
 *                                         generation's names, so the committed one stays
 *                                         whole until the new manifest replaces its own
 *
 * Removal goes only through directories opened without following a link, and removes
 * only regular files (ckfs.c): a link under a checkpoint's names is never crossed.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"

int64_t ck_step_of(const char *name)
{
    if (strncmp(name, "step-", 5) || strlen(name) != 13) return -1;
    int64_t s = 0;
    for (const char *c = name + 5; *c; c++) {
        if (*c < '0' || *c > '9') return -1;
        s = s * 10 + (*c - '0');
    }
    return s;
}

const char *ck_step_name(int64_t step, char *buf, size_t n)
{
    snprintf(buf, n, "step-%08" PRId64, step);
    return buf;
}

const char *ck_rank_file(int rank, int gen, char *buf, size_t n)
{
    snprintf(buf, n, gen ? "rank-%05d.1.safetensors" : "rank-%05d.safetensors", rank);
    return buf;
}

int ck_generation_of(const char *entry)
{
    size_t digits = strncmp(entry, "rank-", 5) ? 0 : strspn(entry + 5, "0123456789");
    if (!digits) return -1;
    const char *rest = entry + 5 + digits;
    return !strcmp(rest, ".safetensors") ? 0 : !strcmp(rest, ".1.safetensors") ? 1 : -1;
}

/* The entries of the directory at (its descriptor stays open), or NULL. */
static DIR *entries(int at)
{
    int fd = dup(at);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d && fd >= 0) close(fd);
    return d;
}

int ck_complete(int root, const char *name)
{
    int at = openat(root, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (at < 0) return 0;
    int done = S_ISREG(ckfs_mode(at, MANIFEST));
    close(at);
    return done;
}

int64_t ck_newest(int root, const char *shown, int *incomplete, char *err, size_t errlen)
{
    DIR *d = entries(root);
    int64_t best = -1;
    *incomplete = 0;
    if (!d) return plan_fail(err, errlen, "%s: %s", shown, strerror(errno)), -2;
    for (struct dirent *en; (en = readdir(d));) {
        int64_t s = ck_step_of(en->d_name);
        if (s < 0) continue;
        mode_t m = ckfs_mode(root, en->d_name);
        if (!S_ISDIR(m)) {
            plan_fail(err, errlen, "%s/%s is %s, not a directory: fsexec reads only the directories it made in a "
                      "checkpoint (remove it, or give the step directory itself)", shown, en->d_name,
                      plan_file_kind((unsigned)m));
            closedir(d);
            return -2;
        }
        int at = openat(root, en->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        mode_t mm = at >= 0 ? ckfs_mode(at, MANIFEST) : 0;
        if (at >= 0) close(at);
        if (mm && !S_ISREG(mm)) {
            plan_fail(err, errlen, "%s/%s/" MANIFEST " is %s, not a regular file: fsexec reads only the files it made "
                      "in a checkpoint", shown, en->d_name, plan_file_kind((unsigned)mm));
            closedir(d);
            return -2;
        }
        if (!mm) *incomplete += 1;
        else if (s > best) best = s;
    }
    closedir(d);
    return best;
}

void ck_remove_files(int at, int gen)
{
    DIR *d = entries(at);
    if (!d) return;
    for (struct dirent *en; (en = readdir(d));) {
        int g = ck_generation_of(en->d_name);
        if ((g >= 0 && (gen < 0 || g == gen)) || ckfs_is_temp(en->d_name)) ckfs_unlink(at, en->d_name);
    }
    closedir(d);
}

/* Removes the step directory `name` inside root: its manifest first (from then on it
 * does not exist), then its files, then the directory when that empties it. */
static void remove_step(int root, const char *name)
{
    int at = openat(root, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (at < 0) return;
    ckfs_unlink(at, MANIFEST);
    ck_remove_files(at, -1);
    close(at);
    unlinkat(root, name, AT_REMOVEDIR);
}

static int by_step(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

void ck_prune(int root, int64_t now, int keep)
{
    DIR *d = entries(root);
    if (!d) return;
    int64_t *done = NULL, *stale = NULL;
    int n_done = 0, n_stale = 0, cap = 0;
    char name[32];
    for (struct dirent *en; (en = readdir(d));) {
        int64_t s = ck_step_of(en->d_name);
        if (s < 0 || !S_ISDIR(ckfs_mode(root, en->d_name))) continue;  // a link is never crossed
        if (n_done == cap || n_stale == cap) {
            int c = cap ? 2 * cap : 64;
            int64_t *a = plan_alloc(sizeof *a * (size_t)c), *b = plan_alloc(sizeof *b * (size_t)c);
            if (!a || !b) {
                plan_dealloc(a), plan_dealloc(b);
                break;
            }
            if (n_done) memcpy(a, done, sizeof *a * (size_t)n_done);
            if (n_stale) memcpy(b, stale, sizeof *b * (size_t)n_stale);
            plan_dealloc(done), plan_dealloc(stale);
            done = a, stale = b, cap = c;
        }
        if (ck_complete(root, en->d_name)) done[n_done++] = s;
        else if (s < now) stale[n_stale++] = s;
    }
    closedir(d);
    if (done) qsort(done, (size_t)n_done, sizeof *done, by_step);
    for (int i = 0; keep > 0 && i < n_done - keep; i++) remove_step(root, ck_step_name(done[i], name, sizeof name));
    for (int i = 0; i < n_stale; i++) remove_step(root, ck_step_name(stale[i], name, sizeof name));
    plan_dealloc(done);
    plan_dealloc(stale);
}

/* Every entry of step directory `name` (inside root) that a save writes, reads or
 * removes is a regular file; 0, or -1 naming the first that is not. */
static int check_step(int root, const char *shown, const char *name, char *err, size_t errlen)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", shown, name);
    int at = ckfs_dir(root, shown, name, 0, NULL, err, errlen);
    if (at < 0) return -1;
    DIR *d = entries(at);
    int rc = d ? 0 : plan_fail(err, errlen, "%s: %s", path, strerror(errno));
    for (struct dirent *en; d && !rc && (en = readdir(d));) {
        if (strcmp(en->d_name, MANIFEST) && ck_generation_of(en->d_name) < 0 && !ckfs_is_temp(en->d_name)) continue;
        mode_t m = ckfs_mode(at, en->d_name);
        if (m && !S_ISREG(m))
            rc = plan_fail(err, errlen, "%s/%s is %s, not a regular file: fsexec reads, writes and removes only the "
                           "files it made in a checkpoint (remove it, or use another --checkpoint-dir)", path,
                           en->d_name, plan_file_kind((unsigned)m));
    }
    if (d) closedir(d);
    close(at);
    return rc;
}

int rt_checkpoint_check_dir(const char *dir, int64_t bytes, char *err, size_t errlen)
{
    struct stat st;
    char parent[4096];
    if (stat(dir, &st) && errno == ENOENT) {  // made by the first save: its parent's file system takes it
        snprintf(parent, sizeof parent, "%s", dir);
        size_t n = strlen(parent);
        while (n > 1 && parent[n - 1] == '/') parent[--n] = 0;
        char *slash = strrchr(parent, '/');
        if (!slash) snprintf(parent, sizeof parent, ".");
        else slash[slash == parent] = 0;
        int at = ckfs_root(parent, 0, err, errlen);
        int rc = at < 0 ? -1 : ckfs_room(at, dir, (uint64_t)bytes, err, errlen);
        if (at >= 0) close(at);
        return rc;
    }
    int root = ckfs_root(dir, 0, err, errlen);
    if (root < 0) return -1;
    DIR *d = entries(root);
    int rc = d ? 0 : plan_fail(err, errlen, "%s: %s", dir, strerror(errno));
    for (struct dirent *en; d && !rc && (en = readdir(d));)
        if (ck_step_of(en->d_name) >= 0) rc = check_step(root, dir, en->d_name, err, errlen);
    if (d) closedir(d);
    if (!rc) rc = ckfs_room(root, dir, (uint64_t)bytes, err, errlen);
    close(root);
    return rc;
}

static int by_name(const void *a, const void *b)
{
    return strcmp((*(const RtPiece *const *)a)->name, (*(const RtPiece *const *)b)->name);
}

int64_t rt_checkpoint_size(const Plan *whole, char *err, size_t errlen)
{
    enum { PER_PIECE = 1024, PER_FILE = 4096 };  // a generous bound on the headers' JSON and the manifest's
    RtLayout l;
    if (rt_plan_layout(whole, &l, err, errlen)) return -1;
    int32_t np = whole->n_programs, n = 0, total = 0;
    RtState **st = plan_alloc(sizeof *st * (size_t)np);
    if (!st) return plan_fail(err, errlen, "out of memory"), -1;
    memset(st, 0, sizeof *st * (size_t)np);
    int64_t bytes = (int64_t)PER_FILE * (l.world + 1);
    for (int32_t k = 0; k < np && bytes >= 0; k++) {  // every logical tensor of each stage, whole
        char why[512];
        Plan *one = np > 1 ? plan_extract_program(whole, k, why, sizeof why) : NULL;
        if (!(np > 1 && !one) && (st[k] = rt_state_of_plan(one ? one : whole, why, sizeof why)))
            total += rt_state_count(st[k]);
        else bytes = -1, plan_fail(err, errlen, "stage %d: %s", k, why);
        plan_free(one);
    }
    const RtPiece **x = bytes < 0 ? NULL : plan_alloc(sizeof *x * (size_t)(total + 1));
    if (bytes >= 0 && !x) bytes = -1, plan_fail(err, errlen, "out of memory");
    for (int32_t k = 0; x && k < np; k++)
        for (int32_t i = 0; i < rt_state_count(st[k]); i++) x[n++] = rt_state_piece(st[k], i);
    if (x) qsort(x, (size_t)n, sizeof *x, by_name);
    for (int32_t i = 0; x && i < n; i++)  // a tensor two stages hold (a tied param) is saved once
        if (!i || strcmp(x[i - 1]->name, x[i]->name))
            bytes += x[i]->count * plan_dtype_size(x[i]->dtype) + PER_PIECE * l.dp;
    plan_dealloc(x);
    for (int32_t k = 0; k < np; k++) rt_state_free(st[k]);
    plan_dealloc(st);
    return bytes;
}
