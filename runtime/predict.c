/* runtime/predict.c: fsexec PLAN --predict --load-weights W (or --resume C) --data ...
 * --out preds.npy: the model's outputs for every sample of the user's .npy files.
 *
 * It runs the plan's evaluation program (eval.c: fsc's forward of the global batch, no
 * backward, dropout the identity, fp32, over the training's ranks and stages) with the
 * trained params, over the samples in order: batch k holds samples ((k - 1) x B + b) mod
 * N of the global batch of B rows, for k = 1 .. ceil(N / B) (the data's sequential
 * order; the last batch's rows past N wrap to the first samples and are not written).
 * Rank r of the data-parallel group computes rows [r B / W, (r + 1) B / W) of each
 * batch, and the stage's first rank gathers them in rank order, so the file's row i is
 * sample i whatever the world. Each output of the model (the eval program's outputs but
 * the loss: what `output NAME` declares) is written by the first rank of the stage that
 * holds it (a pipeline's last stage for the head's), as a .npy file (format 1.0, '<f4' or
 * '<i4', C order) of shape (N, the output's per-sample dims): --out FILE.npy with one
 * output, FILE.NAME.npy for each with several. An output must have the batch as its
 * first dim (per-sample values); the files are written through a temporary file and
 * renamed, streaming batch by batch (no copy of all the predictions in memory). Logits of
 * a padded vocabulary (passes/pad_vocab.c) are written with the model's own columns.
 *
 * The program runs on the device fsexec chose for it (runtime/device.c: the CPU, or a
 * CUDA GPU whose arena is the eval program's): the eval Exec is then the device's host
 * mirror, which takes the params, gets each batch's inputs from the data loader (they go
 * up before the batch) and the outputs after it (they come down), as a training step's
 * do. A failure inside the batches is the rank's own (its peers may wait in a
 * collective or a pipeline's receive): rt_predict returns -2 and the caller ends every
 * rank, the files on this rank abandoned.
 *
 * Inputs that no output reads (a classifier's labels, which feed only the loss) may be
 * left out of --data: they keep their zeros, inside every index bound. An input reaches
 * an output when a chain of ops leads from it to the output within a stage's program;
 * one that a stage sends on (a pipeline's activations) counts as read.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

enum { MAX_OUTPUTS = 64 };

typedef struct {
    int32_t id;         // in this stage's eval program
    char name[256];     // a copy: the stage's program goes with the RtEval
    int64_t per_row;    // elements per sample
    int64_t cols, valid;  // its last dim, and the model's columns of it written (a padded vocabulary's logits:
                          // passes/pad_vocab.c; rt_logits_valid)
    char path[4096];
    PlanOutput *file;   // on the writing rank
} Out;

/* optional[k]: data input k (rt_data_input_list's order) reaches no output but the loss
 * and is sent on by no stage (see the top). */
static int optional_inputs(const Plan *p, uint8_t *optional, int32_t n, char *err, size_t errlen)
{
    int32_t *in = plan_alloc(sizeof *in * (size_t)(n + 1));
    uint8_t *marked = plan_alloc((size_t)p->n_tensors + 1);
    if (!in || !marked) return plan_dealloc(in), plan_dealloc(marked), plan_fail(err, errlen, "out of memory");
    rt_data_input_list(p, in, n);
    int32_t loss = plan_role_tensor(p, PLAN_SR_LOSS);
    for (int32_t k = 0; k < n; k++) {
        int read = 0;
        for (int32_t i = 0; i < p->n_tensors; i++)
            marked[i] = p->tensors[i].role == PLAN_ROLE_INPUT && p->tensors[i].name != PLAN_NONE &&
                        !strcmp(plan_str(p, p->tensors[i].name), plan_str(p, p->tensors[in[k]].name));
        for (int32_t j = 0; j < p->n_ops && !read; j++) {  // ops in issue order: makers before readers
            const PlanOp *op = &p->ops[j];
            int reads = 0;
            for (int32_t i = 0; i < op->n_in && !reads; i++) reads = marked[p->ids[op->in + i]];
            if (!reads) continue;
            read = !strcmp(plan_str(p, op->op), "send");
            for (int32_t o = 0; o < op->n_out; o++) marked[p->ids[op->out + o]] = 1;
        }
        for (int32_t i = 0; i < p->n_outputs && !read; i++) {
            int32_t t = p->outputs[i];
            read = marked[t] && t != loss && p->tensors[t].step_role != PLAN_SR_LOSS;
        }
        optional[k] = !read;
    }
    plan_dealloc(in);
    plan_dealloc(marked);
    return 0;
}

/* This stage's outputs but the loss, each with the batch (B rows) first. */
static int find_outputs(const Plan *p, int64_t B, Out *out, int *n, char *err, size_t errlen)
{
    *n = 0;
    for (int32_t i = 0; i < p->n_outputs; i++) {
        int32_t t = p->outputs[i];
        const PlanTensor *pt = &p->tensors[t];
        if (pt->step_role == PLAN_SR_LOSS || t == plan_role_tensor(p, PLAN_SR_LOSS)) continue;
        const char *name = pt->name == PLAN_NONE ? "?" : plan_str(p, pt->name);
        if (pt->rank < 1 || pt->shape[0] != B)
            return plan_fail(err, errlen, "output '%s' (%s, rank %d) does not have the batch (%" PRId64 " rows a rank) "
                             "as its first dim: --predict writes one row per sample", name, plan_tensor_label(p, t),
                             pt->rank, B);
        if (pt->dtype != PLAN_DT_F32 && pt->dtype != PLAN_DT_I32)
            return plan_fail(err, errlen, "output '%s' is %s in the evaluation program; --predict writes f32 and i32",
                             name, plan_dtype_name(pt->dtype));
        if (*n == MAX_OUTPUTS) return plan_fail(err, errlen, "more than %d outputs", MAX_OUTPUTS);
        int64_t cols = pt->rank > 1 ? pt->shape[pt->rank - 1] : 1;
        out[*n] = (Out){.id = t, .per_row = plan_tensor_numel(pt) / B, .cols = cols,
                        .valid = pt->rank > 1 ? rt_logits_valid(p, t) : cols};
        snprintf(out[*n].name, sizeof out[*n].name, "%s", name);
        (*n)++;
    }
    return 0;
}

/* --out FILE.npy for one output; FILE.NAME.npy for each of several (FILE: --out less .npy). */
static void out_path(const char *out, const char *name, int several, char *buf, size_t n)
{
    size_t len = strlen(out);
    int npy = len >= 4 && !strcmp(out + len - 4, ".npy");
    if (!several) snprintf(buf, n, "%s", out);
    else snprintf(buf, n, "%.*s.%s.npy", (int)(npy ? len - 4 : len), out, name);
}

/* The .npy header (format 1.0) of an array of `rows` samples of t's per-sample shape, its
 * last dim `last` (the model's columns of padded logits). */
static int npy_header(const PlanTensor *t, int64_t rows, int64_t last, char *buf, size_t n)
{
    char shape[256];
    size_t at = (size_t)snprintf(shape, sizeof shape, "(%" PRId64, rows);
    for (int d = 1; d < t->rank && at < sizeof shape; d++)
        at += (size_t)snprintf(shape + at, sizeof shape - at, ", %" PRId64, d == t->rank - 1 ? last : t->shape[d]);
    if (at < sizeof shape) snprintf(shape + at, sizeof shape - at, t->rank == 1 ? ",)" : ")");
    char dict[400];
    int len = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                       t->dtype == PLAN_DT_F32 ? "<f4" : "<i4", shape);
    size_t total = ((size_t)10 + (size_t)len + 1 + 63) / 64 * 64;  // magic, version, u16 length, dict, '\n'
    if (total > n || total - 10 > 65535) return -1;
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (char)((total - 10) & 0xff), buf[9] = (char)((total - 10) >> 8);
    memcpy(buf + 10, dict, (size_t)len);
    memset(buf + 10 + len, ' ', total - 10 - (size_t)len - 1);
    buf[total - 1] = '\n';
    return (int)total;
}

/* Opens every output's file on the writing rank, its header written. */
static int open_files(const Plan *p, Out *out, int n, const char *path, int64_t N, char *err, size_t errlen)
{
    char head[512], why[512];
    for (int i = 0; i < n; i++) {
        out_path(path, out[i].name, n > 1, out[i].path, sizeof out[i].path);
        int len = npy_header(&p->tensors[out[i].id], N, out[i].valid, head, sizeof head);
        if (len < 0) return plan_fail(err, errlen, "output '%s': its shape does not fit a .npy header", out[i].name);
        if (!(out[i].file = plan_output_open(out[i].path, why, sizeof why)))
            return plan_fail(err, errlen, "--out %s: %s", out[i].path, why);
        plan_output_write(out[i].file, head, (size_t)len);
    }
    return 0;
}

/* Batch k's rows of every output: gathered to the stage's first rank, which writes the
 * first `keep` of the global batch's rows. */
static void write_batch(Exec *e, Out *out, int n, int64_t B, int64_t keep, float *recv)
{
    for (int i = 0; i < n; i++) {
        RtTensor t;
        rt_exec_tensor_id(e, out[i].id, &t);
        rt_comm_gather_f32(t.data, B * out[i].per_row, recv);  // 4-byte elements, moved as they are
        if (!out[i].file) continue;
        if (out[i].valid == out[i].cols) {
            plan_output_write(out[i].file, recv, sizeof(float) * (size_t)(keep * out[i].per_row));
            continue;
        }
        for (int64_t r = 0; r < keep * out[i].per_row / out[i].cols; r++)  // each row's model columns alone
            plan_output_write(out[i].file, recv + r * out[i].cols, sizeof(float) * (size_t)out[i].valid);
    }
}

/* Batch k on the device: its inputs up, the program, the outputs down into the mirror
 * (on the CPU, the mirror is the device and nothing moves). 0, or -1 with a message. */
static int run_batch(RtDevice *dev, Exec *e, int64_t k, int graph, char *err, size_t errlen)
{
    if (!rt_device_step_in(dev, e, k) && !rt_device_run_step(dev, graph) && !rt_device_step_out(dev, e)) return 0;
    return plan_fail(err, errlen, "the evaluation program, batch %" PRId64 ": %s", k,
                     rt_device_is_cpu(dev) ? rt_exec_error(e) : dev->ops->error(dev->b));
}

/* Every batch; a failure is this rank's alone (the others may wait in a collective). */
static int run_batches(RtEval *v, RtDevice *dev, int graph, Out *out, int n, char *err, size_t errlen)
{
    Exec *e = rt_eval_exec(v);
    RtData *d = rt_eval_data(v);
    int dp = rt_exec_world(e);
    int64_t N = rt_data_samples(d), Bg = rt_data_rows(d), B = Bg / dp, most = 1;
    for (int i = 0; i < n; i++)
        if (out[i].per_row * Bg > most) most = out[i].per_row * Bg;
    float *recv = plan_alloc(sizeof(float) * (size_t)most);
    if (!recv) return plan_fail(err, errlen, "out of memory for a batch of predictions (%" PRId64 " values)", most);
    int rc = 0;
    for (int64_t k = 1; (k - 1) * Bg < N && !rc; k++) {
        rt_data_fill(d, k);
        if ((rc = run_batch(dev, e, k, graph, err, errlen))) break;
        int64_t keep = N - (k - 1) * Bg < Bg ? N - (k - 1) * Bg : Bg;
        write_batch(e, out, n, B, keep, recv);
    }
    plan_dealloc(recv);
    return rc;
}

/* What rt_predict does before the batches: this stage's outputs, the params, the files. */
static int prepare(RtEval *v, const RtPredictOptions *o, Out *out, int *n, char *err, size_t errlen)
{
    Exec *e = rt_eval_exec(v);
    const Plan *p = rt_exec_plan(e);
    RtData *d = rt_eval_data(v);
    int64_t N = rt_data_samples(d), B = rt_data_rows(d) / rt_exec_world(e);
    if (find_outputs(p, B, out, n, err, errlen) || rt_eval_take_params(v, err, errlen)) return -1;
    return rt_exec_rank(e) == 0 ? open_files(p, out, *n, o->out, N, err, errlen) : 0;
}

/* o->dev on the eval program as it is now (its params taken): this stage's outputs come
 * down after each batch. 0, or -1 after the device's message. */
static int open_device(RtEval *v, const RtPredictOptions *o, const Out *out, int n)
{
    int32_t ids[MAX_OUTPUTS];
    for (int i = 0; i < n; i++) ids[i] = out[i].id;
    return rt_device_open(o->dev, rt_eval_exec(v), o->rk, o->tf32, 0, ids, n);
}

/* Whether some stage's program has an output but the loss (every rank sees the whole plan). */
static int has_outputs(const Plan *eval)
{
    int32_t loss = plan_role_tensor(eval, PLAN_SR_LOSS);
    for (int32_t i = 0; i < eval->n_outputs; i++)
        if (eval->outputs[i] != loss && eval->tensors[eval->outputs[i]].step_role != PLAN_SR_LOSS) return 1;
    return 0;
}

int rt_predict(const Plan *whole, Exec *train, const RtPredictOptions *o, char *written, size_t wlen, char *err,
               size_t errlen)
{
    if (written && wlen) written[0] = 0;
    if (!whole->eval)
        return plan_fail(err, errlen, "--predict runs the plan's evaluation program, which this plan has not (%s); "
                         "recompile it, or use a plan of one stage or another pipeline schedule",
                         rt_exec_stages(train) > 1 ? "a pipeline with interleaved model chunks" : "an older fsc");
    if (!has_outputs(whole->eval))
        return plan_fail(err, errlen, "--predict writes the model's outputs, and this one declares none but the loss: "
                         "add `output NAME;` for each value to predict (the logits, say) and recompile");
    if (!rt_data_names_inputs(whole->eval, o->data))
        return plan_fail(err, errlen, "--predict reads .npy files of the model's inputs: --data NAME=FILE.npy,... (or "
                         "--data DIR of NAME.npy files), not '%s'", o->data);
    int32_t n_in = rt_data_input_list(whole->eval, NULL, 0);
    uint8_t *optional = plan_alloc((size_t)n_in + 1);
    Out *out = plan_alloc(sizeof *out * MAX_OUTPUTS);
    int n = 0, rc = !optional || !out ? plan_fail(err, errlen, "out of memory") : 0;
    if (!rc) rc = optional_inputs(whole->eval, optional, n_in, err, errlen);
    RtEvalOptions vo = {.path = o->data, .batches = 1, .seed = o->seed, .flag = "--data", .optional = optional,
                        .mirror = !rt_device_is_cpu(o->dev)};
    RtEval *v = rc ? NULL : rt_eval_new(whole, train, &vo, err, errlen);
    if (!rc && !v) rc = -1;
    if (!rc) rc = prepare(v, o, out, &n, err, errlen);
    if (rt_comm_agree(rc ? 1 : 0)) rc = -1;  // every stage ready before a device is made (NCCL's init is collective)
    else if (open_device(v, o, out, n)) rc = -2;
    else if (run_batches(v, o->dev, o->graph, out, n, err, errlen)) rc = -2;
    char device[sizeof o->dev->name];
    snprintf(device, sizeof device, "%s", o->dev->name);  // what open named ("cuda:0 NVIDIA H200 (sm_90)")
    rt_device_close(o->dev);
    rt_eval_free(v);
    char why[512];
    size_t at = 0;
    for (int i = 0; out && i < n; i++) {
        if (!out[i].file) continue;
        if (rc) plan_output_abort(out[i].file);
        else if (plan_output_commit(out[i].file, why, sizeof why))
            rc = plan_fail(err, errlen, "--out %s: %s", out[i].path, why);
        else if (written && at < wlen)
            at += (size_t)snprintf(written + at, wlen - at, "%s%s (%s)", at ? ", " : "", out[i].path, out[i].name);
    }
    if (at && at < wlen) snprintf(written + at, wlen - at, " on %s", device);
    plan_dealloc(out);
    plan_dealloc(optional);
    return rc == -2 ? -2 : rt_comm_agree(rc ? 1 : 0) ? -1 : 0;
}
