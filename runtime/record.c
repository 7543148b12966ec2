/* runtime/record.c: what a checkpoint records of its run beyond the state, and what a
 * resume compares with it before a byte of state is read.
 *
 * The model: its dims as fsc resolved them (META "dims", the global batch, whatever the
 * world) and its param set (every param's name and shape, over all stages; not dtypes, so
 * that another precision is the same model). A plan of the same model (another world,
 * strategy, precision, stages, offload) has the same of both. The batch dim alone may
 * change: it shapes no param and a run may take another batch size on purpose. A
 * mismatch lists every dim that differs and every param missing, extra or reshaped.
 *
 * The data: its kind (a token file, .npy files, the built-in data) and each file's
 * absolute path, size and the CRC-32 of its first MiB, enough to see another file, or
 * the same path rewritten, without reading gigabytes at the start. A checkpoint's run that
 * read files, resumed without --data, would train on the built-in data: that is an
 * error unless --resume-other-data says so; a file that differs is a warning.
 *
 * A checkpoint written before these records (no "model_check", no data "kind") is
 * compared by what it has: its pieces' names and shapes.
 */
#define _XOPEN_SOURCE 700  // realpath
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "record.h"

/* ---- the model ----------------------------------------------------------------------- */

typedef struct {
    const char *name;
    int rank;
    const int64_t *shape;
} Param;

static int by_param(const void *a, const void *b) { return strcmp(((const Param *)a)->name, ((const Param *)b)->name); }

typedef struct {
    RtState **states;  // the names point into these, the shapes into their plans
    Plan **plans;      // a pipeline's stages, extracted; NULL entries for a plan of one stage
    int32_t n_states;
    Param *p;
    int32_t n;
} Params;

static void params_free(Params *ps)
{
    for (int32_t k = 0; ps->states && k < ps->n_states; k++) rt_state_free(ps->states[k]);
    for (int32_t k = 0; ps->plans && k < ps->n_states; k++) plan_free(ps->plans[k]);
    plan_dealloc(ps->states);
    plan_dealloc(ps->plans);
    plan_dealloc(ps->p);
}

/* Every param of the whole plan (each stage's), once each, sorted by name; -1 when out of
 * memory or a stage cannot be read. */
static int plan_params(const Plan *whole, Params *ps)
{
    memset(ps, 0, sizeof *ps);
    ps->n_states = whole->n_programs > 0 ? whole->n_programs : 1;
    ps->states = plan_alloc(sizeof *ps->states * (size_t)ps->n_states);
    ps->plans = plan_alloc(sizeof *ps->plans * (size_t)ps->n_states);
    if (!ps->states || !ps->plans) return -1;
    memset(ps->states, 0, sizeof *ps->states * (size_t)ps->n_states);
    memset(ps->plans, 0, sizeof *ps->plans * (size_t)ps->n_states);
    int32_t total = 0;
    char why[512];
    for (int32_t k = 0; k < ps->n_states; k++) {
        Plan *one = ps->plans[k] = whole->n_programs > 1 ? plan_extract_program(whole, k, why, sizeof why) : NULL;
        if (whole->n_programs > 1 && !one) return -1;
        if (!(ps->states[k] = rt_state_of_plan(one ? one : whole, why, sizeof why))) return -1;
        total += rt_state_count(ps->states[k]);
    }
    if (!(ps->p = plan_alloc(sizeof *ps->p * (size_t)(total + 1)))) return -1;
    for (int32_t k = 0; k < ps->n_states; k++)
        for (int32_t i = 0; i < rt_state_count(ps->states[k]); i++) {
            const RtPiece *x = rt_state_piece(ps->states[k], i);
            if (x->kind == RT_STATE_PARAM) ps->p[ps->n++] = (Param){x->name, x->rank, x->shape};
        }
    qsort(ps->p, (size_t)ps->n, sizeof *ps->p, by_param);
    int32_t kept = 0;
    for (int32_t i = 0; i < ps->n; i++)
        if (!kept || strcmp(ps->p[kept - 1].name, ps->p[i].name)) ps->p[kept++] = ps->p[i];
    ps->n = kept;
    return 0;
}

static uint64_t param_set_hash(const Params *ps)
{
    uint64_t h = PLAN_FNV1A_INIT;
    for (int32_t i = 0; i < ps->n; i++) {
        h = plan_fnv1a(h, ps->p[i].name, strlen(ps->p[i].name) + 1);
        int64_t r = ps->p[i].rank;
        h = plan_fnv1a(h, &r, sizeof r);
        h = plan_fnv1a(h, ps->p[i].shape, sizeof *ps->p[i].shape * (size_t)ps->p[i].rank);
    }
    return h;
}

json_t *rt_record_model(const Plan *whole)
{
    Params ps;
    json_t *m = NULL;
    if (!plan_params(whole, &ps)) {
        char h[24];
        snprintf(h, sizeof h, "%016" PRIx64, param_set_hash(&ps));
        m = json_pack("{s:s,s:s,s:s,s:I}", "dims", plan_meta_str(whole, "dims", ""), "batch_dim",
                      plan_meta_str(whole, "batch_dim", ""), "param_set", h, "params", (json_int_t)ps.n);
    }
    params_free(&ps);
    return m;
}

static void add(char *buf, size_t n, const char *fmt, const char *a, const char *b, const char *c)
{
    size_t at = strlen(buf);
    if (at + 8 >= n) return;
    if (at + strlen(a) + (b ? strlen(b) : 0) + (c ? strlen(c) : 0) + 40 >= n) {
        if (!strstr(buf, ", ...")) snprintf(buf + at, n - at, ", ...");
        return;
    }
    snprintf(buf + at, n - at, fmt, a, b ? b : "", c ? c : "");
}

/* "[32, 96]" */
static const char *shape_str(int rank, const int64_t *shape, char *buf, size_t n)
{
    size_t at = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < rank && at < n; d++)
        at += (size_t)snprintf(buf + at, n - at, "%s%" PRId64, d ? ", " : "", shape[d]);
    if (at < n) snprintf(buf + at, n - at, "]");
    return buf;
}

/* The value of dim `name` in "A=1 B=2 ...", or NULL; its length in *len. */
static const char *dim_value(const char *dims, const char *name, size_t *len)
{
    size_t nl = strlen(name);
    for (const char *at = dims; at && *at;) {
        const char *end = strchr(at, ' ');
        size_t l = end ? (size_t)(end - at) : strlen(at);
        if (l > nl && !strncmp(at, name, nl) && at[nl] == '=') {
            *len = l - nl - 1;
            return at + nl + 1;
        }
        at = end ? end + 1 : NULL;
    }
    return NULL;
}

/* Each dim of `from` (but the batch dim) that `to` has with another value, or has not. */
static void dims_differ(const char *saved, const char *now, const char *batch, char *buf, size_t n, int *count)
{
    for (int pass = 0; pass < 2; pass++) {  // the checkpoint's dims, then the ones only this plan has
        const char *from = pass ? now : saved, *to = pass ? saved : now;
        for (const char *at = from; *at;) {
            const char *eq = strchr(at, '='), *end = strchr(at, ' ');
            if (!eq) break;
            char name[64], a[32] = "", b[32] = "";
            snprintf(name, sizeof name, "%.*s", (int)(eq - at) < 63 ? (int)(eq - at) : 63, at);
            size_t la = end ? (size_t)(end - eq - 1) : strlen(eq + 1), lb = 0;
            snprintf(a, sizeof a, "%.*s", (int)(la < 31 ? la : 31), eq + 1);
            const char *v = dim_value(to, name, &lb);
            if (v) snprintf(b, sizeof b, "%.*s", (int)(lb < 31 ? lb : 31), v);
            at = end ? end + 1 : eq + strlen(eq);
            if (!strcmp(name, batch) || (v && !strcmp(a, b)) || (pass && v)) continue;
            char line[160];
            if (!v) snprintf(line, sizeof line, "%s only in %s", name, pass ? "this plan" : "the checkpoint");
            else snprintf(line, sizeof line, "%s %s in the checkpoint, %s in this plan", name, a, b);
            add(buf, n, "%s%s%s", *count ? ", " : "", line, NULL);
            ++*count;
        }
    }
}

int rt_resume_check_model(const RtCheckpoint *c, const Plan *whole, char *msg, size_t n)
{
    msg[0] = 0;
    const json_t *rec = json_object_get(rt_checkpoint_manifest(c), "model_check");
    const char *saved = json_string_value(json_object_get(rec, "dims"));
    const char *now = plan_meta_str(whole, "dims", ""), *batch = plan_meta_str(whole, "batch_dim", "");
    char dims[512] = "", missing[512] = "", extra[512] = "", reshaped[768] = "", a[128], b[128];
    int n_dims = 0, n_missing = 0, n_extra = 0, n_reshaped = 0;
    if (saved && *saved && *now) dims_differ(saved, now, batch, dims, sizeof dims, &n_dims);
    Params ps;
    if (plan_params(whole, &ps)) {
        params_free(&ps);
        snprintf(msg, n, "out of memory comparing the model with the checkpoint's");
        return -1;
    }
    int32_t i = 0, j = 0, nc = rt_checkpoint_count(c);
    RtPiece cp;
    while (i < ps.n || j < nc) {
        if (j < nc) {
            rt_checkpoint_piece(c, j, &cp);
            if (cp.kind != RT_STATE_PARAM || cp.first) {  // a param's first piece: its name and shape
                j++;
                continue;
            }
        }
        int order = i >= ps.n ? 1 : j >= nc ? -1 : strcmp(ps.p[i].name, cp.name);
        if (order < 0) add(missing, sizeof missing, "%s%s%s", n_missing++ ? ", " : "", ps.p[i++].name, NULL);
        else if (order > 0) add(extra, sizeof extra, "%s%s%s", n_extra++ ? ", " : "", cp.name, NULL), j++;
        else {
            int same = cp.rank == ps.p[i].rank;
            for (int d = 0; same && d < cp.rank; d++) same = cp.shape[d] == ps.p[i].shape[d];
            if (!same) {
                char both[300];
                shape_str(cp.rank, cp.shape, a, sizeof a);
                shape_str(ps.p[i].rank, ps.p[i].shape, b, sizeof b);
                snprintf(both, sizeof both, "%s (%s in the checkpoint, %s in this plan)", ps.p[i].name, a, b);
                add(reshaped, sizeof reshaped, "%s%s%s", n_reshaped++ ? ", " : "", both, NULL);
            }
            i++, j++;
        }
    }
    params_free(&ps);
    if (!n_dims && !n_missing && !n_extra && !n_reshaped) return 0;
    int at = snprintf(msg, n, "%s is of another model than this plan:", rt_checkpoint_dir(c));
    const char *part[] = {"dims that differ", "params this plan has and the checkpoint has not",
                          "params only in the checkpoint", "params of another shape"};
    const char *what[] = {dims, missing, extra, reshaped};
    int count[] = {n_dims, n_missing, n_extra, n_reshaped};
    for (int k = 0, first = 1; k < 4; k++)
        if (count[k] && at > 0 && (size_t)at < n) {
            at += snprintf(msg + at, n - (size_t)at, "%s %s (%d): %s", first ? "" : ";", part[k], count[k], what[k]);
            first = 0;
        }
    return 1;
}

/* ---- the data ------------------------------------------------------------------------ */

enum { HEAD = 1 << 20 };  // the bytes of a file whose CRC-32 is recorded

/* One file of --data: its absolute path, size and first MiB's CRC-32 (bytes -1 when it
 * cannot be read now). */
static json_t *data_file(const char *name, const char *path)
{
    char abs[PATH_MAX], why[256], crc[16] = "";
    if (!realpath(path, abs)) snprintf(abs, sizeof abs, "%s", path);
    int64_t size = -1;
    int fd = plan_open_input(path, &size, why, sizeof why);
    uint8_t *buf = fd >= 0 ? plan_alloc(HEAD) : NULL;
    if (buf) {
        ssize_t got = pread(fd, buf, HEAD, 0);
        if (got >= 0) snprintf(crc, sizeof crc, "%08" PRIx32, plan_crc32(0, buf, (size_t)got));
    }
    plan_dealloc(buf);
    if (fd >= 0) close(fd);
    return json_pack("{s:s,s:s,s:I,s:s}", "name", name, "path", abs, "bytes", (json_int_t)(fd >= 0 ? size : -1),
                     "head_crc32", crc);
}

json_t *rt_record_data(const char *data)
{
    json_t *files = json_array();
    const char *kind = !data ? "synthetic" : strchr(data, '=') ? "npy" : "tokens";
    if (data && !strchr(data, '=')) {
        json_array_append_new(files, data_file("data", data));
    } else if (data) {  // NAME=FILE.npy,NAME=FILE.npy
        for (const char *at = data; *at && files;) {
            const char *comma = strchr(at, ','), *eq = strchr(at, '=');
            size_t len = comma ? (size_t)(comma - at) : strlen(at);
            if (eq && (size_t)(eq - at) < len) {
                char name[256], path[PATH_MAX];
                snprintf(name, sizeof name, "%.*s", (int)(eq - at) < 255 ? (int)(eq - at) : 255, at);
                snprintf(path, sizeof path, "%.*s", (int)(len - (size_t)(eq - at) - 1), eq + 1);
                json_array_append_new(files, data_file(name, path));
            }
            at = comma ? comma + 1 : at + len;
        }
    }
    return files ? json_pack("{s:s,s:o}", "kind", kind, "files", files) : NULL;
}

/* "tokens.bin (/abs/tokens.bin, 1,234 bytes)" of a recorded file, or its path alone. */
static const char *file_str(const json_t *f, char *buf, size_t n)
{
    snprintf(buf, n, "%s (%" PRId64 " bytes)", json_string_value(json_object_get(f, "path")),
             (int64_t)json_integer_value(json_object_get(f, "bytes")));
    return buf;
}

int rt_resume_check_data(const RtCheckpoint *c, const char *data, int other_ok, char *msg, size_t n)
{
    msg[0] = 0;
    const json_t *was = json_object_get(rt_checkpoint_manifest(c), "data");
    const char *kind = json_string_value(json_object_get(was, "kind"));
    const json_t *files = json_object_get(was, "files");
    if (!kind || !json_is_array(files)) return 0;  // a checkpoint without the record: nothing to compare
    char a[PATH_MAX + 64], list[2048] = "";
    size_t nf = json_array_size(files);
    for (size_t k = 0; k < nf; k++)
        add(list, sizeof list, "%s%s%s", k ? ", " : "", file_str(json_array_get(files, k), a, sizeof a), NULL);
    if (!data && nf) {
        if (other_ok) return 0;
        snprintf(msg, n, "the checkpoint's run trained on %s; this run has no --data and would train on the built-in "
                 "data instead. Give --data with %s to go on with %s, or --resume-other-data to train on other data "
                 "on purpose", list, nf == 1 ? "that file" : "those files", nf == 1 ? "it" : "them");
        return -1;
    }
    json_t *now = rt_record_data(data);
    const json_t *nfiles = json_object_get(now, "files");
    char why[3072] = "";
    if (!now) {
        snprintf(msg, n, "out of memory comparing the data with the checkpoint's");
        return -1;
    }
    if (json_array_size(nfiles) != nf || strcmp(kind, json_string_value(json_object_get(now, "kind"))))
        snprintf(why, sizeof why, "the checkpoint's run trained on %s", nf ? list : "the built-in data");
    for (size_t k = 0; k < nf && !why[0]; k++) {
        const json_t *x = json_array_get(files, k), *y = json_array_get(nfiles, k);
        const char *what = json_integer_value(json_object_get(x, "bytes")) !=
                                   json_integer_value(json_object_get(y, "bytes"))
                               ? "its size differs"
                           : strcmp(json_string_value(json_object_get(x, "head_crc32")),
                                    json_string_value(json_object_get(y, "head_crc32")))
                               ? "its first MiB differs"
                               : NULL;
        if (what)
            snprintf(why, sizeof why, "the checkpoint's run trained on %s; %s is not that file (%s)",
                     file_str(x, a, sizeof a), json_string_value(json_object_get(y, "path")), what);
    }
    json_decref(now);
    if (!why[0] || other_ok) return 0;
    snprintf(msg, n, "%s: this run trains on other data from the checkpoint's step on (--resume-other-data says so "
             "on purpose)", why);
    return 1;
}
