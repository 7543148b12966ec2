/* runtime/eval.c: evaluation on held-out data (fsexec --val-data), with the plan's
 * evaluation program (Plan.eval: fsc's forward and loss of the global batch, no
 * backward, no optimizer, dropout the identity, over the training's data-parallel
 * ranks and strategy, with its own arena; with pipeline stages, cut as the training's:
 * each rank runs its stage's program, the batch going through the stages as one
 * micro-batch, and the loss is the last stage's, which is where the step line is
 * printed).
 *
 * The eval program has params of its own, under the training program's names (and, under
 * sharding, the same flat storages, split the same way), so an evaluation starts by
 * copying this rank's bytes of each from the training Exec: a copy of the params rather
 * than a second planner for one arena shared by two programs. Then K batches: batch k is
 * the k-th batch of the sequential order of the token file, or of .npy files of the
 * model's inputs (any model that trains on .npy files: NAME=FILE.npy,NAME=FILE.npy as
 * --data), the same K batches every time whatever the training's --data-order; or for a
 * classifier, `blobs`: the blobs of batch 2^40 + k, which no training step draws. The
 * loss of a batch is every rank's alike (the program averages it over the ranks, as the
 * training step does); the accuracy is summed over the ranks here. The result is the
 * mean over the K batches.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "runtime.h"

#define BLOB_HELD_OUT ((int64_t)1 << 40)  // the first blob batch of evaluation

typedef struct {
    int32_t eval, train;  // tensor ids: the eval program's param, the training's of that name
    int64_t bytes;        // this rank's bytes of it
} Pair;

struct RtEval {
    Exec *e;
    Plan *stage;          // a pipeline's: this rank's stage program of the eval plan (owned), or NULL
    RtData *data;
    const Exec *train;
    Pair *pairs;
    int32_t n_pairs;
    int64_t batches;
    int blobs;            // held-out blobs (batch 2^40 + k), else batch k of the file's order
};

/* Tensors whose bytes are their own (not a view) and that no op makes: the params and
 * the flat storages they lie in. */
static int is_param_root(const PlanTensor *t)
{
    return t->role == PLAN_ROLE_PARAM && t->alias == PLAN_NONE && t->producer == PLAN_NONE && t->name != PLAN_NONE;
}

static int32_t find_param(const Plan *p, const char *name)
{
    for (int32_t i = 0; i < p->n_tensors; i++)
        if (is_param_root(&p->tensors[i]) && !strcmp(plan_str(p, p->tensors[i].name), name)) return i;
    return PLAN_NONE;
}

/* Each of the eval program's params with its training counterpart: same name, dtype,
 * shape and split over the ranks, or an error (a plan whose programs disagree). */
static int pair_params(RtEval *v, char *err, size_t errlen)
{
    const Plan *ep = rt_exec_plan(v->e), *tp = rt_exec_plan(v->train);
    if (!(v->pairs = plan_alloc(sizeof *v->pairs * (size_t)(ep->n_tensors ? ep->n_tensors : 1))))
        return plan_fail(err, errlen, "out of memory");
    for (int32_t i = 0; i < ep->n_tensors; i++) {
        const PlanTensor *t = &ep->tensors[i];
        if (!is_param_root(t)) continue;
        const char *name = plan_str(ep, t->name);
        int32_t j = find_param(tp, name);
        const PlanTensor *u = j == PLAN_NONE ? NULL : &tp->tensors[j];
        if (!u || u->dtype != t->dtype || plan_tensor_nbytes(u) != plan_tensor_nbytes(t) ||
            u->sharded != t->sharded || (u->rank_stride != 0) != (t->rank_stride != 0))
            return plan_fail(err, errlen, "the evaluation program's param '%s' (%s, %lld bytes) has no like param in "
                             "the training program%s; recompile the plan", name, plan_dtype_name(t->dtype),
                             (long long)plan_tensor_nbytes(t), u ? " (its dtype, size or split differ)" : "");
        v->pairs[v->n_pairs++] = (Pair){i, j, plan_tensor_nbytes(t)};
    }
    return 0;
}

RtEval *rt_eval_new(const Plan *whole, Exec *train, const RtEvalOptions *o, char *err, size_t errlen)
{
    int stages = rt_exec_stages(train);
    if (!whole->eval) {
        if (stages > 1)
            plan_fail(err, errlen, "--val-data: this plan is a pipeline of %d stages with interleaved model chunks (or "
                      "from an older fsc), for which fsc plans no evaluation program; evaluate with a plan of another "
                      "schedule, or of one stage, e.g. from --save-weights or a checkpoint", stages);
        else
            plan_fail(err, errlen, "--val-data: the plan has no evaluation program (compiled by an older fsc); "
                      "recompile it");
        return NULL;
    }
    RtEval *v = plan_alloc(sizeof *v);
    if (!v) {
        plan_fail(err, errlen, "out of memory");
        return NULL;
    }
    memset(v, 0, sizeof *v);
    v->train = train, v->batches = o->batches;
    ExecOptions eo = {.seed = o->seed, .nan_fill = o->nan_fill, .rank = rt_exec_rank(train), .world = rt_exec_world(train),
                      .whole = stages > 1 ? whole->eval : NULL, .stage = rt_exec_stage(train), .mirror = o->mirror};
    char why[512];
    RtDataKind kind = rt_data_kind(whole->eval);
    int blobs = !strcmp(o->path, "blobs"), arrays = rt_data_names_inputs(whole->eval, o->path);
    const Plan *program = whole->eval;
    if (stages > 1 && !(program = v->stage = plan_extract_program(whole->eval, eo.stage, why, sizeof why))) {
        plan_fail(err, errlen, "the evaluation program of stage %d: %s", eo.stage, why);
        rt_eval_free(v);
        return NULL;
    }
    if (blobs && kind != RT_DATA_CLASSES)
        plan_fail(err, errlen, "--val-data blobs is for classifiers of f32 [B, D] features and i32 [B] labels; give "
                  "this model %s", kind == RT_DATA_LM ? "a token file, or .npy files of its inputs (NAME=FILE.npy,"
                  "NAME=FILE.npy)" : ".npy files of its inputs: --val-data NAME=FILE.npy,NAME=FILE.npy");
    else if (!blobs && !arrays && kind == RT_DATA_CLASSES)
        plan_fail(err, errlen, "--val-data %s: a classifier evaluates on .npy files of its inputs (--val-data "
                  "NAME=FILE.npy,NAME=FILE.npy, as --data) or on held-out Gaussian blobs (--val-data blobs)", o->path);
    else if (!arrays && kind == RT_DATA_NONE)
        plan_fail(err, errlen, "--val-data %s: this model's inputs take .npy files: --val-data NAME=FILE.npy,"
                  "NAME=FILE.npy, by the inputs' names, as --data", o->path);
    else if (!(v->e = rt_exec_new(program, &eo, why, sizeof why)))
        plan_fail(err, errlen, "the evaluation program: %s", why);
    else if (!(v->data = rt_data_open_for(v->e, blobs ? NULL : o->path, o->format, RT_ORDER_SEQUENTIAL, o->seed,
                                          o->optional, why, sizeof why)))
        plan_fail(err, errlen, "%s %s: %s", o->flag ? o->flag : "--val-data", o->path, why);
    else if (!pair_params(v, err, errlen)) {
        v->blobs = blobs;
        return v;
    }
    rt_eval_free(v);
    return NULL;
}

void rt_eval_free(RtEval *v)
{
    if (!v) return;
    rt_data_close(v->data);
    rt_exec_free(v->e);
    plan_free(v->stage);
    plan_dealloc(v->pairs);
    plan_dealloc(v);
}

int64_t rt_eval_arena_bytes(const RtEval *v) { return rt_exec_arena_bytes(v->e); }

/* The f32 scalar loss of the eval program. */
static double loss_of(const Exec *e)
{
    int32_t id = plan_role_tensor(rt_exec_plan(e), PLAN_SR_LOSS);
    if (id == PLAN_NONE) return NAN;  // a pipeline's stage but the last
    RtTensor t;
    rt_exec_tensor_id(e, id, &t);
    return t.dtype == PLAN_DT_F32 && t.numel == 1 ? *(const float *)t.data : NAN;
}

/* Correct predictions of this rank's rows, and how many rows count (not the ignored
 * labels), for a classifier. */
static int64_t correct_of(const RtEval *v, int64_t *rows)
{
    int32_t li = rt_data_logits(v->data), yi = rt_data_labels(v->data);
    *rows = 0;
    if (li == PLAN_NONE || yi == PLAN_NONE) return 0;
    RtTensor lt, yt;
    rt_exec_tensor_id(v->e, li, &lt);
    rt_exec_tensor_id(v->e, yi, &yt);
    if (lt.dtype != PLAN_DT_F32 || lt.rank != 2 || yt.dtype != PLAN_DT_I32 || yt.rank != 1) return 0;
    int64_t K = lt.shape[1], W = rt_plan_valid_columns(rt_exec_plan(v->e), K);  // a padded head's own classes
    return rt_correct_of(lt.data, yt.data, lt.shape[0], K, W, rt_data_ignore(v->data), rows);
}

Exec *rt_eval_exec(RtEval *v) { return v->e; }
RtData *rt_eval_data(RtEval *v) { return v->data; }

int rt_eval_take_params(RtEval *v, char *err, size_t errlen)
{
    for (int32_t i = 0; i < v->n_pairs; i++) {
        const Pair *q = &v->pairs[i];
        void *dst = rt_exec_data(v->e, q->eval);
        const void *src = rt_exec_data(v->train, q->train);
        if (!dst || !src) return plan_fail(err, errlen, "the evaluation program: param %d is not in its arena", q->eval);
        memcpy(dst, src, (size_t)q->bytes);
    }
    return 0;
}

int rt_eval_run(RtEval *v, double *loss, double *accuracy, char *err, size_t errlen)
{
    if (rt_eval_take_params(v, err, errlen)) return -1;
    double sum = 0;
    int64_t correct = 0, rows = 0;
    for (int64_t k = 1; k <= v->batches; k++) {
        rt_data_fill(v->data, v->blobs ? BLOB_HELD_OUT + k : k);
        if (rt_exec_run(v->e, k, RT_PHASES_ALL))
            return plan_fail(err, errlen, "the evaluation program, batch %lld: %s", (long long)k, rt_exec_error(v->e));
        sum += loss_of(v->e);
        int64_t n;
        correct += correct_of(v, &n);
        rows += n;
    }
    *loss = sum / (double)v->batches;
    *accuracy = NAN;
    int classifier = rt_data_logits(v->data) != PLAN_NONE && rt_data_labels(v->data) != PLAN_NONE;
    if (classifier && rt_exec_world(v->e) > 1) correct = rt_comm_sum_i64(correct), rows = rt_comm_sum_i64(rows);
    if (rows) *accuracy = (double)correct / (double)rows;
    return 0;
}
