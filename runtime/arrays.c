/* runtime/arrays.c: a model's data inputs from NumPy .npy files, any number of them, each
 * by its .fsm name: --data x=feats.npy,y=labels.npy,mask=m.npy (fsexec joins repeated
 * --data flags with commas), or --data DIR, a directory holding NAME.npy for each input.
 *
 * Every file is read whole (runtime/npy.c converts float64/int64 to f32/i32) and checked
 * before any step, each error naming the input and the file: an input without a file,
 * a file for no input, one given twice, a dtype or per-sample shape that is not the
 * input's, files of different sample counts (each sample of one needs its partner in
 * every other), an f32 value that is not finite (but -inf in an additive attention mask,
 * rt_input_masks_only), and an i32 value an op indexes with
 * outside what it indexes (rt_input_bound: an embedding's rows, a loss's classes; the one
 * value an index read also allows, rt_input_sentinel, passes). So no kernel meets a value
 * out of range, which runtime/opcheck_mem.c's proof assumes.
 *
 * Sample b of step s (1-based) of a global batch of B rows, of n: ((s - 1) * B + b) mod
 * n in order (sequential, wrapping as token windows do), or Philox(seed ^ RT_DATA_KEY,
 * (s, b, 0)), 64 bits mod n (random). Rank r fills its rows [row0, row0 + B) of the
 * global batch, so every world reads the same batches; a pipeline's stage fills the
 * inputs its program reads. Where it sits: data.c opens it for .npy specs; the
 * evaluation and --predict (eval.c, predict.c) read through the same RtData.
 */
#include <inttypes.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime.h"

enum { MAX_INPUTS = 256, SPEC = 8192 };

struct RtArrays {
    int32_t n;          // the whole plan's data inputs
    int32_t *id;        // [n] each input's tensor in the whole plan
    RtArray *arr;       // [n] its file's array; data NULL: none given (an optional input: zeros)
    void **dst;         // [n] this stage's tensor of it, or NULL
    int64_t n_samples;  // the files' first dim
};

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int rt_data_names_inputs(const Plan *p, const char *spec)
{
    if (!spec || rt_data_input_list(p, NULL, 0) == 0) return 0;
    if (is_dir(spec)) return 1;
    const char *eq = strchr(spec, '='), *slash = strchr(spec, '/');
    struct stat st;
    return eq && eq > spec && (!slash || slash > eq) && stat(spec, &st) != 0;  // NAME=..., not a file named so
}

/* "x (f32 [B, 16]), y (i32 [B])": the inputs, for messages. */
static const char *inputs_str(const Plan *p, const RtArrays *a, char *buf, size_t n)
{
    size_t at = 0;
    buf[0] = 0;
    for (int32_t k = 0; k < a->n && at < n; k++) {
        const PlanTensor *t = &p->tensors[a->id[k]];
        at += (size_t)snprintf(buf + at, n - at, "%s%s (%s [B", k ? ", " : "", plan_str(p, t->name),
                               plan_dtype_name(t->dtype));
        for (int32_t j = 1; j < t->rank && at < n; j++)
            at += (size_t)snprintf(buf + at, n - at, ", %" PRId64, t->shape[j]);
        if (at < n) at += (size_t)snprintf(buf + at, n - at, "])");
    }
    return buf;
}

/* "--data x=x.npy,y=y.npy": the flag that gives every input (but the optional) a file,
 * for messages. */
static const char *example(const Plan *p, const RtArrays *a, const uint8_t *optional, char *buf, size_t n)
{
    size_t at = (size_t)snprintf(buf, n, "--data ");
    for (int32_t k = 0, first = 1; k < a->n && at < n; k++) {
        const char *name = plan_str(p, p->tensors[a->id[k]].name);
        if (optional && optional[k]) continue;
        at += (size_t)snprintf(buf + at, n - at, "%s%s=%s.npy", first ? "" : ",", name, name);
        first = 0;
    }
    return buf;
}

/* The file's dtype, and its shape after the first dim (the samples) against the input's
 * per-sample shape. */
static int check_array(const Plan *p, const PlanTensor *t, const char *path, const RtArray *arr, char *err,
                       size_t errlen)
{
    char want[128], got[128], file[160];
    const char *name = plan_str(p, t->name);
    rt_npy_shape_str(t->rank - 1, t->shape + 1, want, sizeof want);
    rt_npy_shape_str(arr->rank, arr->shape, got, sizeof got);
    snprintf(file, sizeof file, "(N%s%s", t->rank > 1 ? ", " : ",)", t->rank > 1 ? want + 1 : "");
    if (t->rank == 2) file[strlen(file) - 2] = ')', file[strlen(file) - 1] = 0;  // (N, 16), not (N, 16,)
    if (arr->dtype != t->dtype)
        return plan_fail(err, errlen, "%s: input '%s' is %s, but the file holds %s ('%s'): save it as %s "
                         "(np.save(path, a.astype(np.%s)))", path, name, plan_dtype_name(t->dtype),
                         arr->dtype == PLAN_DT_F32 ? "floats" : "integers", arr->descr, t->dtype == PLAN_DT_F32 ? "float32 or float64" :
                         "int32 or int64", t->dtype == PLAN_DT_F32 ? "float32" : "int32");
    int same = arr->rank == t->rank && arr->rank >= 1;
    for (int32_t j = 1; same && j < t->rank; j++) same = arr->shape[j] == t->shape[j];
    if (!same)
        return plan_fail(err, errlen, "%s: shape %s, but input '%s' takes samples of shape %s: the file's shape "
                         "must be %s, with N samples first", path, got, name, want, file);
    if (arr->shape[0] < 1) return plan_fail(err, errlen, "%s: shape %s holds no samples", path, got);
    return 0;
}

/* What the ops that input t reaches index (rt_input_bound's op `by`), for messages. */
static const char *indexes(const Plan *p, int32_t by, char *buf, size_t n)
{
    int32_t idx;
    int64_t bound;
    if (rt_op_index(p, by, &idx, &bound) == RT_INDEX_CLASSES) return "the model's classes";
    const PlanOp *op = &p->ops[by];
    int32_t table = strcmp(plan_str(p, op->op), "embedding") ? PLAN_NONE : p->ids[op->in];
    snprintf(buf, n, "the rows of embedding table '%s'", table == PLAN_NONE ? "?" : plan_tensor_label(p, table));
    return buf;
}

/* "element 17" of a 1-D array, "element 35 (sample 2)" of one with samples of several. */
static const char *element(const RtArray *arr, int64_t i, char *buf, size_t n)
{
    int64_t per = arr->numel / arr->shape[0];
    if (per > 1) snprintf(buf, n, "element %" PRId64 " (sample %" PRId64 ")", i, i / per);
    else snprintf(buf, n, "element %" PRId64, i);
    return buf;
}

/* Every value of input t's array is one the model takes (see the top). */
static int check_values(const Plan *p, int32_t t, const char *path, const RtArray *arr, char *err, size_t errlen)
{
    char at[96], what[256], also[96] = "";
    const char *name = plan_str(p, p->tensors[t].name);
    if (arr->dtype == PLAN_DT_F32) {
        const float *v = arr->data;
        int mask = rt_input_masks_only(p, t);  // an additive key mask: -inf masks a key
        for (int64_t i = 0; i < arr->numel; i++)
            if (!isfinite(v[i]) && !(mask && v[i] == -INFINITY))
                return plan_fail(err, errlen, "%s: %s is %s; input '%s' takes finite numbers%s: clean the file "
                                 "(np.isfinite finds them)", path, element(arr, i, at, sizeof at),
                                 isnan(v[i]) ? "NaN" : v[i] > 0 ? "inf" : "-inf", name,
                                 mask ? " (and -inf, a masked key)" : "");
        return 0;
    }
    int32_t by;
    int64_t bound = rt_input_bound(p, t, &by), skip = 0;
    if (bound < 0) return plan_fail(err, errlen, "out of memory");
    int has = rt_input_sentinel(p, t, &skip);
    if (has) snprintf(also, sizeof also, ", or %" PRId64 " (the ignore_index it skips)", skip);
    const int32_t *v = arr->data;
    for (int64_t i = 0; i < arr->numel && bound; i++)
        if ((v[i] < 0 || v[i] >= bound) && !(has && v[i] == skip))
            return plan_fail(err, errlen, "%s: %s is %d, outside %s (0 to %" PRId64 "%s), which input '%s' indexes",
                             path, element(arr, i, at, sizeof at), v[i], indexes(p, by, what, sizeof what),
                             bound - 1, also, name);
    return 0;
}

/* The k of input `name` in a, or -1. */
static int32_t input_of(const Plan *p, const RtArrays *a, const char *name)
{
    for (int32_t k = 0; k < a->n; k++)
        if (!strcmp(name, plan_str(p, p->tensors[a->id[k]].name))) return k;
    return -1;
}

/* Each input's file from "NAME=FILE,NAME=FILE" or a directory, into path[] (into buf). */
static int parse_spec(const Plan *p, const RtArrays *a, const char *spec, char *buf, const char **path, char *err,
                      size_t errlen)
{
    char names[1024];
    inputs_str(p, a, names, sizeof names);
    if (is_dir(spec)) {
        size_t at = 0;
        for (int32_t k = 0; k < a->n; k++) {  // an input without its file has none (optional, or an error)
            struct stat st;
            char *one = buf + at;
            at += (size_t)snprintf(one, SPEC - at, "%s/%s.npy", spec, plan_str(p, p->tensors[a->id[k]].name)) + 1;
            if (at >= SPEC) return plan_fail(err, errlen, "--data %s: the directory's path is too long", spec);
            path[k] = stat(one, &st) == 0 ? one : NULL;
        }
        return 0;
    }
    if (strlen(spec) >= SPEC) return plan_fail(err, errlen, "--data: longer than %d characters", SPEC - 1);
    snprintf(buf, SPEC, "%s", spec);
    for (char *item = buf, *next; item; item = next) {
        next = strchr(item, ',');
        if (next) *next++ = 0;
        char *eq = strchr(item, '=');
        if (!eq || eq == item || !eq[1])
            return plan_fail(err, errlen, "--data: '%s' is not NAME=FILE.npy; this model's inputs are %s", item, names);
        *eq = 0;
        int32_t k = input_of(p, a, item);
        if (k < 0) return plan_fail(err, errlen, "--data: the model has no input '%s'; its inputs are %s", item, names);
        if (path[k]) return plan_fail(err, errlen, "--data: input '%s' is given twice", item);
        path[k] = eq + 1;
    }
    return 0;
}

/* read_all's work, the paths in buf. */
static int read_paths(RtArrays *a, const Plan *p, const char *spec, const uint8_t *optional, char *buf,
                      const char **path, char *describe, size_t dlen, char *err, size_t errlen)
{
    char ex[1024];
    if (parse_spec(p, a, spec, buf, path, err, errlen)) return -1;
    int32_t first = -1;
    for (int32_t k = 0; k < a->n; k++) {
        const PlanTensor *t = &p->tensors[a->id[k]];
        if (!path[k] && optional && optional[k]) continue;
        if (!path[k] && is_dir(spec))
            return plan_fail(err, errlen, "--data %s: no file %s.npy for input '%s'; the directory needs one NAME.npy "
                             "for each input", spec, plan_str(p, t->name), plan_str(p, t->name));
        if (!path[k])
            return plan_fail(err, errlen, "--data: no file for input '%s'; give every input one, as in %s",
                             plan_str(p, t->name), example(p, a, optional, ex, sizeof ex));
        if (rt_npy_read(path[k], &a->arr[k], err, errlen) || check_array(p, t, path[k], &a->arr[k], err, errlen))
            return -1;
        if (first < 0) first = k;
        if (a->arr[k].shape[0] != a->arr[first].shape[0])
            return plan_fail(err, errlen, "--data: %s holds %" PRId64 " samples for input '%s' and %s %" PRId64 " for "
                             "input '%s'; each sample of one needs its partner in the other", path[first],
                             a->arr[first].shape[0], plan_str(p, p->tensors[a->id[first]].name), path[k],
                             a->arr[k].shape[0], plan_str(p, t->name));
    }
    if (first < 0) return plan_fail(err, errlen, "--data: no file for any input; give them as in %s",
                                    example(p, a, optional, ex, sizeof ex));
    a->n_samples = a->arr[first].shape[0];
    size_t at = 0;
    for (int32_t k = 0; k < a->n; k++) {
        if (!a->arr[k].data) continue;
        if (check_values(p, a->id[k], path[k], &a->arr[k], err, errlen)) return -1;
        if (at < dlen) at += (size_t)snprintf(describe + at, dlen - at, "%s%s=%s", at ? ", " : "",
                                              plan_str(p, p->tensors[a->id[k]].name), path[k]);
    }
    if (at < dlen) snprintf(describe + at, dlen - at, " (%" PRId64 " samples)", a->n_samples);
    return 0;
}

/* Reads every input's file (optional[k]: input k may have none), checked. */
static int read_all(RtArrays *a, const Plan *p, const char *spec, const uint8_t *optional, char *describe,
                    size_t dlen, char *err, size_t errlen)
{
    const char *path[MAX_INPUTS] = {0};
    char *buf = plan_alloc(SPEC);
    int rc = !buf ? plan_fail(err, errlen, "out of memory")
                  : read_paths(a, p, spec, optional, buf, path, describe, dlen, err, errlen);
    plan_dealloc(buf);
    return rc;
}

RtArrays *rt_arrays_open(Exec *e, const char *spec, const uint8_t *optional, char *describe, size_t dlen, char *err,
                         size_t errlen)
{
    const Plan *p = rt_exec_whole(e), *stage = rt_exec_plan(e);
    int32_t n = rt_data_input_list(p, NULL, 0);
    if (n > MAX_INPUTS) {
        plan_fail(err, errlen, "--data: the model has %d data inputs; fsexec feeds at most %d", n, MAX_INPUTS);
        return NULL;
    }
    RtArrays *a = plan_alloc(sizeof *a);
    if (a) memset(a, 0, sizeof *a);
    if (!a || !(a->id = plan_alloc(sizeof *a->id * (size_t)(n + 1))) ||
        !(a->arr = plan_alloc(sizeof *a->arr * (size_t)(n + 1))) ||
        !(a->dst = plan_alloc(sizeof *a->dst * (size_t)(n + 1)))) {
        rt_arrays_free(a);
        plan_fail(err, errlen, "out of memory");
        return NULL;
    }
    a->n = rt_data_input_list(p, a->id, n);
    memset(a->arr, 0, sizeof *a->arr * (size_t)(n + 1));
    for (int32_t k = 0; k < n; k++) {
        int32_t s = rt_stage_input(p, a->id[k], stage);
        a->dst[k] = s == PLAN_NONE ? NULL : rt_exec_data(e, s);
    }
    if (read_all(a, p, spec, optional, describe, dlen, err, errlen)) {
        rt_arrays_free(a);
        return NULL;
    }
    return a;
}

int64_t rt_arrays_samples(const RtArrays *a) { return a->n_samples; }

int64_t rt_data_sample(RtDataOrder order, uint64_t seed, int64_t step, int64_t B, int64_t b, int64_t n)
{
    if (order == RT_ORDER_SEQUENTIAL)
        return (int64_t)((((uint64_t)step - 1) * (uint64_t)B + (uint64_t)b) % (uint64_t)n);
    uint32_t ctr[4] = {(uint32_t)step, (uint32_t)((uint64_t)step >> 32), (uint32_t)b, 0}, w[4];
    rt_philox(seed ^ RT_DATA_KEY, ctr, w);
    return (int64_t)(((uint64_t)w[0] << 32 | w[1]) % (uint64_t)n);
}

void rt_arrays_fill(RtArrays *a, RtDataOrder order, uint64_t seed, int64_t step, int64_t B_global, int64_t row0,
                    int64_t rows)
{
    for (int32_t k = 0; k < a->n; k++) {
        if (!a->dst[k] || !a->arr[k].data) continue;
        size_t row = (size_t)(a->arr[k].numel / a->n_samples) * 4;
        for (int64_t b = 0; b < rows; b++) {
            int64_t i = rt_data_sample(order, seed, step, B_global, row0 + b, a->n_samples);
            memcpy((uint8_t *)a->dst[k] + (size_t)b * row, (const uint8_t *)a->arr[k].data + (size_t)i * row, row);
        }
    }
}

void rt_arrays_free(RtArrays *a)
{
    if (!a) return;
    for (int32_t k = 0; a->arr && k < a->n; k++) rt_npy_free(&a->arr[k]);
    plan_dealloc(a->id), plan_dealloc(a->arr), plan_dealloc(a->dst);
    plan_dealloc(a);
}
