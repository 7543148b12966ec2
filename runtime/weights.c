/* runtime/weights.c: the model's params and gradients in and out, as safetensors files
 * (runtime/safetensors.c), under the model's param names ("h.3.attn.w"; a gradient under
 * its param's name).
 *
 * Flat layouts (the shard pass) are consolidated: each unit's authoritative flat ranges
 * (rt_flat_owned) are gathered to the first rank of the stage, which writes the params;
 * loading, every rank reads the whole file and keeps what its storages hold. The result
 * of a save or a load is agreed over every rank of the world, so all go on or all stop.
 *
 * A pipeline (several stages) saves as Hugging Face's sharded checkpoints: the first rank
 * of each stage writes its stage's params to out-0000k-of-0000P.safetensors and world
 * rank 0 then writes out.safetensors.index.json, naming for every param the first stage
 * file that holds it (a param two stages hold, as a tied embedding, is in both, with the
 * same values). Each stage loads the params it has from one file of the whole model, or
 * from such an index (as written, or Hugging Face's own: PATH.index.json, or PATH when
 * only PATH.index.json exists): each shard it names read for the params the index puts
 * there, every other tensor of a shard one the model has.
 *
 * Another format (runtime/hf.c: Hugging Face's names and layouts) changes only the file:
 * the same entries are read through rt_hf_read and written through rt_hf_write, and a
 * pipeline's index names the format's tensors.
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kernels.h"
#include "runtime.h"

enum { SAVED_NONE, SAVED_OWN, SAVED_FLAT };

/* How the file holds tensor i: not at all; from its own bytes (a param of an unsharded
 * plan); or from its unit's consolidated flat layout (a param view of a sharded plan;
 * fsdp's second view of a param, under the same name, is left out). */
static int saved_kind(const Plan *p, int32_t i)
{
    const PlanTensor *t = &p->tensors[i];
    if (t->role != PLAN_ROLE_PARAM || t->tied_to != PLAN_NONE) return SAVED_NONE;
    if (rt_flat_is_param(t, t->unit)) {
        for (int32_t j = 0; j < i; j++)
            if (rt_flat_is_param(&p->tensors[j], p->tensors[j].unit) &&
                !strcmp(plan_str(p, p->tensors[j].name), plan_str(p, t->name)))
                return SAVED_NONE;
        return SAVED_FLAT;
    }
    if (t->alias != PLAN_NONE || t->rank_stride || t->sharded || rt_flat_is_storage(p, i)) return SAVED_NONE;
    return SAVED_OWN;
}

/* Each unit's whole flat layout (elements from flat 0), where a storage has one. */
typedef struct {
    float **full;       // by unit (plan_check: fewer than PLAN_UNITS); NULL: no storage, or not this rank's
    int32_t n;
    float *recv;        // the stage's first rank: room for the largest gather of flat_gather
} Flat;

static void flat_free(Flat *f)
{
    for (int32_t u = 0; f->full && u < f->n; u++) plan_dealloc(f->full[u]);
    plan_dealloc(f->full);
    plan_dealloc(f->recv);
    f->full = NULL, f->recv = NULL;
}

/* Zeroed buffers for the units with storage (all of them: the stage's first rank or
 * every rank), and with `gathers` the room flat_gather receives into. */
static int flat_alloc(const Exec *e, Flat *f, int mine, int gathers, char *err, size_t errlen)
{
    const Plan *p = rt_exec_plan(e);
    int world = rt_exec_world(e);
    int64_t most = 0;
    f->n = PLAN_UNITS(p->n_blocks);  // per group: blocks, the params outside them, a stage's tied copies
    f->full = plan_alloc(sizeof *f->full * (size_t)f->n);
    if (!f->full) return plan_fail(err, errlen, "out of memory");
    memset(f->full, 0, sizeof *f->full * (size_t)f->n);
    for (int32_t i = 0; i < p->n_tensors && mine; i++) {
        const PlanTensor *t = &p->tensors[i];
        if (t->role != PLAN_ROLE_PARAM || !rt_flat_is_storage(p, i) || t->unit >= f->n || f->full[t->unit]) continue;
        size_t len = (size_t)rt_flat_length(p, i, (int)plan_shard_group(p, world));
        if (!(f->full[t->unit] = plan_alloc(sizeof(float) * len)))
            return plan_fail(err, errlen, "out of memory for the %zu params of unit %d", len, t->unit);
        memset(f->full[t->unit], 0, sizeof(float) * len);
        RtOwned o;
        rt_flat_owned(p, i, world, &o);
        if (!o.replicated && o.count * world > most) most = o.count * world;
    }
    if (gathers && most && !(f->recv = plan_alloc(sizeof(float) * (size_t)most)))
        return plan_fail(err, errlen, "out of memory gathering %" PRId64 " params", most);
    return 0;
}

/* The first rank's full[unit] from every rank's authoritative part of storage s
 * (rt_flat_owned); every rank of the stage calls it, for the same storages in the same
 * order. */
static void flat_gather(const Exec *e, int32_t s, Flat *f)
{
    const Plan *p = rt_exec_plan(e);
    const PlanTensor *t = &p->tensors[s];
    const uint8_t *arena = rt_exec_space(e, t->place);  // the host space, once offload put the master there
    int rank = rt_exec_rank(e), world = rt_exec_world(e), shard = (int)plan_shard_group(p, world);
    float *full = f->full && t->unit < f->n ? f->full[t->unit] : NULL;
    RtOwned o;
    rt_flat_owned(p, s, world, &o);
    if (rank == 0 && !t->sharded)  // the whole buffer first: padding, and all of it when replicated
        memcpy(full + t->flat_offset, arena + t->offset, (size_t)plan_tensor_nbytes(t));
    if (o.replicated) return;
    rt_comm_gather_f32((const float *)(arena + o.byte_offset + (int64_t)(rank % shard) * o.byte_stride), o.count,
                       f->recv);
    for (int q = 0; rank == 0 && q < world; q++)  // hybrid sharding: q's replicas hold the same shard, q % shard
        memcpy(full + o.flat_first + q % shard * o.flat_stride, f->recv + q * o.count, sizeof(float) * (size_t)o.count);
}

/* The entries of every saved param (grads: each param's "<name>.grad"), in tensor order;
 * flat params point into f's buffers. */
static int collect(const Exec *e, int grads, const Flat *f, StEntry **out, int32_t *n, char *err, size_t errlen)
{
    const Plan *p = rt_exec_plan(e);
    /* The entries, then room for each one's logical shape (a padded vocabulary's own), freed with them. */
    size_t room = (size_t)(p->n_tensors + 1);
    *out = plan_alloc(sizeof **out * room + sizeof(int64_t) * PLAN_MAX_RANK * room);
    int64_t *shapes = *out ? (int64_t *)(void *)(*out + room) : NULL;
    char *name = plan_alloc(1024);
    if (!*out || !name) {
        plan_dealloc(name);
        return plan_fail(err, errlen, "out of memory");
    }
    *n = 0;
    for (int32_t i = 0; i < p->n_tensors; i++) {
        int kind = saved_kind(p, i);
        if (kind == SAVED_NONE) continue;
        RtTensor t;
        rt_exec_tensor_id(e, i, &t);
        if (kind == SAVED_FLAT) {
            const PlanTensor *pt = &p->tensors[i];
            t.data = f && pt->unit < f->n && f->full[pt->unit] ? f->full[pt->unit] + pt->flat_offset : NULL;
            t.dtype = PLAN_DT_F32;  // the storage's: a 16-bit view (fsdp's gathered compute copy) has f32 master bytes
            if (!t.data && !grads) {
                plan_dealloc(name);
                return plan_fail(err, errlen, "param '%s' lies in unit %d, which has no storage", t.name, pt->unit);
            }
        }
        if (grads) {
            RtTensor g;
            snprintf(name, 1024, "%s.grad", t.name);
            if (rt_exec_tensor(e, name, &g) || g.role != PLAN_ROLE_GRAD) continue;  // no gradient reaches it
            t.data = g.data, t.dtype = g.dtype;
        }
        int64_t *shape = shapes + (size_t)*n * PLAN_MAX_RANK;
        plan_tensor_logical_shape(&p->tensors[i], shape);  // a padded param's file tensor is its own rows
        (*out)[(*n)++] = (StEntry){t.name, t.dtype, t.rank, shape, t.data};
    }
    plan_dealloc(name);
    if (grads && !*n) return plan_fail(err, errlen, "the plan has no gradients to save");
    return 0;
}

const char *rt_weights_shard_path(const char *path, int stage, int stages, char *buf, size_t n)
{
    if (stages <= 1) {
        snprintf(buf, n, "%s", path);
        return buf;
    }
    static const char ext[] = ".safetensors";
    size_t len = strlen(path), el = sizeof ext - 1;
    int has = len >= el && !strcmp(path + len - el, ext);
    snprintf(buf, n, "%.*s-%05d-of-%05d%s", (int)(has ? len - el : len), path, stage + 1, stages, ext);
    return buf;
}

/* The params every stage of `whole` saves, each named once (as format fmt names it) with
 * the file of the first stage holding it (basename of rt_weights_shard_path(path)), as a
 * JSON object; their bytes, each counted once, in *total. NULL with a message. */
static json_t *weight_map(const Plan *whole, const char *path, RtWeightsFormat fmt, int64_t *total, char *err,
                          size_t errlen)
{
    json_t *map = json_object();
    *total = 0;
    for (int32_t k = 0; k < whole->n_programs && map; k++) {
        char file[1024], why[512];
        const char *slash = strrchr(rt_weights_shard_path(path, k, whole->n_programs, file, sizeof file), '/');
        Plan *one = plan_extract_program(whole, k, why, sizeof why);
        if (!one) {
            json_decref(map);
            plan_fail(err, errlen, "stage %d: %s", k, why);
            return NULL;
        }
        for (int32_t i = 0; i < one->n_tensors && map; i++) {
            int kind = saved_kind(one, i);
            char hf[512];
            const char *ours = plan_str(one, one->tensors[i].name);
            const char *name = kind == SAVED_NONE ? NULL : rt_hf_name(fmt, ours, hf, sizeof hf);
            if (!name || json_object_get(map, name)) continue;  // a param without a name in fmt fails the save first
            const PlanTensor *t = &one->tensors[i];
            int64_t es = kind == SAVED_FLAT ? (int64_t)sizeof(float) : plan_dtype_size(t->dtype);
            *total += plan_tensor_logical_numel(t) * es;
            if (json_object_set_new(map, name, json_string(slash ? slash + 1 : file))) json_decref(map), map = NULL;
        }
        plan_free(one);
    }
    if (!map) plan_fail(err, errlen, "out of memory");
    return map;
}

/* PATH.index.json of a pipeline's sharded weights (see the top). */
static int write_index(const Plan *whole, const char *path, RtWeightsFormat fmt, char *err, size_t errlen)
{
    int64_t total;
    json_t *map = weight_map(whole, path, fmt, &total, err, errlen);
    if (!map) return -1;
    json_t *index = json_pack("{s:{s:I}}", "metadata", "total_size", (json_int_t)total);
    char *text = index && !json_object_set_new(index, "weight_map", map) ? json_dumps(index, JSON_INDENT(2) | JSON_SORT_KEYS)
                                                                          : NULL;
    if (!index) json_decref(map);
    json_decref(index);
    char file[1024], why[512];
    snprintf(file, sizeof file, "%s.index.json", path);
    if (!text) return plan_fail(err, errlen, "%s: out of memory", file);
    size_t len = strlen(text);
    text[len] = '\n';  // json_dumps ends the text with its NUL: a newline in its place, NUL-free output
    PlanChunk chunk = {text, len + 1};
    int rc = plan_write_atomic(file, &chunk, 1, why, sizeof why);
    free(text);
    return rc ? plan_fail(err, errlen, "%s: %s", file, why) : 0;
}

int rt_save_weights(const Exec *e, const char *path, int64_t step, char *err, size_t errlen)
{
    return rt_save_weights_as(e, path, step, RT_WEIGHTS_FSEXEC, err, errlen);
}

int rt_save_weights_as(const Exec *e, const char *path, int64_t step, RtWeightsFormat fmt, char *err, size_t errlen)
{
    const Plan *p = rt_exec_plan(e);
    int rank = rt_exec_rank(e), stage = rt_exec_stage(e), stages = rt_exec_stages(e);
    Flat f = {0};
    err[0] = 0;
    int rc = rt_comm_agree(flat_alloc(e, &f, rank == 0, 1, err, errlen) ? 1 : 0);
    for (int32_t i = 0; i < p->n_tensors && !rc; i++)
        if (p->tensors[i].role == PLAN_ROLE_PARAM && rt_flat_is_storage(p, i)) flat_gather(e, i, &f);
    if (!rc && rank == 0) {
        StEntry *t = NULL;
        int32_t n;
        char file[1024];
        rc = collect(e, 0, &f, &t, &n, err, errlen);
        rt_weights_shard_path(path, stage, stages, file, sizeof file);
        if (!rc) rc = fmt == RT_WEIGHTS_FSEXEC ? rt_st_write(file, t, n, step, err, errlen)
                                               : rt_hf_write(file, fmt, t, n, step, err, errlen);
        plan_dealloc(t);
    }
    flat_free(&f);
    rc = rt_comm_agree(rc ? 1 : 0);
    if (stages > 1 && !rc) rc = rt_comm_agree(rank == 0 && stage == 0 && write_index(rt_exec_whole(e), path, fmt, err, errlen));
    return rc ? -1 : 0;
}

static int64_t numel(const StEntry *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->rank; d++) n *= t->shape[d];
    return n;
}

/* The gradients of entries t, made f32 and divided by the loss scale, in one buffer that
 * the entries then point into (free() it); NULL when out of memory. */
static float *unscaled(StEntry *t, int32_t n, float scale)
{
    int64_t total = 0;
    for (int32_t i = 0; i < n; i++) total += numel(&t[i]);
    float *all = malloc(sizeof *all * (size_t)(total ? total : 1)), *y = all;
    for (int32_t i = 0; all && i < n; i++) {
        int64_t m = numel(&t[i]);
        const uint16_t *h = t[i].data;
        for (int64_t k = 0; k < m; k++) {
            float v = t[i].dtype == PLAN_DT_F32    ? ((const float *)t[i].data)[k]
                      : t[i].dtype == PLAN_DT_F16 ? cpu_f16_to_f32(h[k])
                                                   : cpu_bf16_to_f32(h[k]);
            y[k] = v / scale;
        }
        t[i].data = y, t[i].dtype = PLAN_DT_F32, y += m;
    }
    return all;
}

int32_t rt_save_grads_point(const Exec *e, char *err, size_t errlen)
{
    const Plan *p = rt_exec_plan(e);
    int32_t split = p->n_ops;  // the first optimizer op that reads a gradient (not the learning rate's)
    for (int32_t k = 0; k < p->n_ops && split == p->n_ops; k++)
        for (int32_t i = 0; i < p->ops[k].n_in && p->ops[k].phase == PLAN_PHASE_OPTIMIZER; i++)
            if (p->tensors[p->ids[p->ops[k].in + i]].role == PLAN_ROLE_GRAD) split = k;
    const char *off = plan_meta_str(p, "offload", "none"), *why = strcmp(off, "none") ? off : NULL;
    for (int32_t k = split; k < p->n_ops; k++)
        if (p->ops[k].phase == PLAN_PHASE_BACKWARD)
            return plan_fail(err, errlen, "--save-grads: this plan never holds all its gradients at once: its "
                             "optimizer reads them (op %d, %s) before its backward ends (op %d, %s)%s%s; compile the "
                             "same model without it to save them (the step-1 gradients are the same)", split,
                             plan_str(p, p->ops[split].op), k, plan_str(p, p->ops[k].op),
                             why ? ", as --offload " : "", why ? why : "");
    for (int32_t i = 0; i < p->n_tensors; i++) {
        const PlanTensor *t = &p->tensors[i];
        if (t->role != PLAN_ROLE_GRAD || t->place != PLAN_PLACE_DEVICE) continue;
        const PlanTensor *root = t->alias != PLAN_NONE ? &p->tensors[t->alias] : t;
        if (root->live_end < split)  // its bytes may be another tensor's by the end of the backward
            return plan_fail(err, errlen, "--save-grads: %s's buffer is free before the optimizer reads it (op %d, %s)%s%s; "
                             "compile the same model without it to save the gradients",
                             t->name != PLAN_NONE ? plan_str(p, t->name) : "a gradient", split,
                             plan_str(p, p->ops[split].op), why ? ", as --offload " : "", why ? why : "");
    }
    return split;
}

int rt_save_grads(const Exec *e, const char *path, int64_t step, char *err, size_t errlen)
{
    if (rt_exec_world(e) * rt_exec_stages(e) > 1)
        return plan_fail(err, errlen, "saving gradients is supported for world 1 only (with more ranks they are "
                       "reduced and sharded); run the world-1 plan");
    StEntry *t;
    int32_t n;
    int rc = collect(e, 1, NULL, &t, &n, err, errlen);
    /* fp16's gradients are the scaled loss's until the update unscales them: the file has the
     * loss's own, in f32 (what PyTorch's GradScaler.unscale_ leaves in .grad). */
    int32_t ls = plan_role_tensor(rt_exec_plan(e), PLAN_SR_LOSS_SCALE);
    float scale = ls == PLAN_NONE ? 1.0f : *(const float *)rt_exec_data(e, ls), *own = NULL;
    if (!rc && scale != 1.0f && !(own = unscaled(t, n, scale))) rc = plan_fail(err, errlen, "out of memory");
    if (!rc) rc = rt_st_write(path, t, n, step, err, errlen);
    free(own);
    plan_dealloc(t);
    return rc;
}

/* The names of every stage's params, for a stage that reads the file of the whole model
 * (none with one stage): in *also, pointing into *map's keys. */
static int other_stages(const Exec *e, json_t **map, const char ***also, int32_t *n, char *err, size_t errlen)
{
    int64_t total;
    *map = NULL, *also = NULL, *n = 0;
    if (rt_exec_stages(e) == 1) return 0;
    if (!(*map = weight_map(rt_exec_whole(e), "", RT_WEIGHTS_FSEXEC, &total, err, errlen))) return -1;
    if (!(*also = plan_alloc(sizeof **also * (json_object_size(*map) + 1)))) return plan_fail(err, errlen, "out of memory");
    const char *key;
    json_t *v;
    json_object_foreach(*map, key, v) (*also)[(*n)++] = key;
    return 0;
}

/* ---- Hugging Face's sharded index ---------------------------------------------------- */

static int ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && !strcmp(s + n - m, tail);
}

/* The index to read for --load-weights path: path itself when it ends in .index.json,
 * path.index.json when path is not there but that is (the path --save-weights took); else
 * NULL: a single file. */
static const char *index_of(const char *path, char *buf, size_t n)
{
    struct stat st;
    if (ends_with(path, ".index.json")) return path;
    snprintf(buf, n, "%s.index.json", path);
    return stat(path, &st) != 0 && stat(buf, &st) == 0 ? buf : NULL;
}

/* The shard the index's map names for our param `ours` (fmt's name, or that name
 * without the format's prefix, as a base model's files have it); NULL if none. */
static const char *shard_of(json_t *map, RtWeightsFormat fmt, const char *ours)
{
    char hf[512];
    const char *name = rt_hf_name(fmt, ours, hf, sizeof hf), *bare = name ? rt_hf_unprefixed(fmt, name) : NULL;
    json_t *v = name ? json_object_get(map, name) : NULL;
    if (!v && bare) v = json_object_get(map, bare);
    return json_string_value(v);
}

/* Reads the entries t from the shards index's weight_map names (beside the index), each
 * shard for the entries it holds; a shard's other tensors must be the model's (t's
 * others, or another stage's in `also`). */
static int read_shards(json_t *map, const char *index, RtWeightsFormat fmt, const StEntry *t, int32_t n,
                       const char *const *also, int32_t n_also, char *err, size_t errlen)
{
    StEntry *mine = plan_alloc(sizeof *mine * ((size_t)n + 1));
    const char **rest = plan_alloc(sizeof *rest * ((size_t)n + (size_t)n_also + 1));
    int rc = !mine || !rest ? plan_fail(err, errlen, "out of memory") : 0;
    for (int32_t i = 0; i < n && !rc; i++)
        if (!shard_of(map, fmt, t[i].name))
            rc = plan_fail(err, errlen, "%s names no shard for our param '%s'%s", index, t[i].name,
                           fmt == RT_WEIGHTS_FSEXEC ? "" : " (in the weights format's names)");
    const char *slash = strrchr(index, '/'), *key, *seen_key;
    json_t *v, *seen_v;
    json_object_foreach(map, key, v) {
        const char *file = json_string_value(v);
        if (rc) break;
        if (!file || !file[0]) {
            rc = plan_fail(err, errlen, "%s: weight_map's \"%s\" is not a file name", index, key);
            break;
        }
        int first = 1;  // each shard once: at the first key that names it
        json_object_foreach(map, seen_key, seen_v) {
            if (seen_key == key) break;
            if (!strcmp(json_string_value(seen_v) ? json_string_value(seen_v) : "", file)) first = 0;
        }
        if (!first) continue;
        int32_t m = 0, r = 0;
        for (int32_t i = 0; i < n; i++) {
            if (!strcmp(shard_of(map, fmt, t[i].name), file)) mine[m++] = t[i];
            else rest[r++] = t[i].name;
        }
        for (int32_t i = 0; i < n_also; i++) rest[r++] = also[i];
        char path[4096];
        if (file[0] == '/' || !slash) snprintf(path, sizeof path, "%s", file);
        else snprintf(path, sizeof path, "%.*s/%s", (int)(slash - index), index, file);
        rc = fmt == RT_WEIGHTS_FSEXEC ? rt_st_read_part(path, mine, m, rest, r, err, errlen)
                                      : rt_hf_read(path, fmt, mine, m, rest, r, err, errlen);
    }
    plan_dealloc(mine);
    plan_dealloc(rest);
    return rc;
}

/* The entries t from the sharded weights of `index` (see the top). */
static int read_index(const char *index, RtWeightsFormat fmt, const StEntry *t, int32_t n, const char *const *also,
                      int32_t n_also, char *err, size_t errlen)
{
    json_error_t je;
    json_t *root = json_load_file(index, JSON_REJECT_DUPLICATES, &je);
    if (!root) return plan_fail(err, errlen, "%s: not a sharded weights index (JSON): %s, line %d", index, je.text,
                                je.line);
    json_t *map = json_object_get(root, "weight_map");
    int rc = json_is_object(map) ? read_shards(map, index, fmt, t, n, also, n_also, err, errlen)
                                 : plan_fail(err, errlen, "%s: no \"weight_map\" object of tensor names and their "
                                             "shard files: not a Hugging Face sharded index", index);
    json_decref(root);
    return rc;
}

int rt_load_weights(Exec *e, const char *path, char *err, size_t errlen)
{
    return rt_load_weights_as(e, path, RT_WEIGHTS_FSEXEC, err, errlen);
}

int rt_load_weights_as(Exec *e, const char *path, RtWeightsFormat fmt, char *err, size_t errlen)
{
    const Plan *p = rt_exec_plan(e);
    StEntry *t = NULL;
    int32_t n, n_also = 0;
    Flat f = {0};
    json_t *map = NULL;
    const char **also = NULL;
    err[0] = 0;
    int rc = flat_alloc(e, &f, 1, 0, err, errlen) || other_stages(e, &map, &also, &n_also, err, errlen);
    if (!rc) rc = collect(e, 0, &f, &t, &n, err, errlen);
    char buf[4096];
    const char *index = index_of(path, buf, sizeof buf);
    if (!rc && index) rc = read_index(index, fmt, t, n, also, n_also, err, errlen);
    else if (!rc) rc = fmt == RT_WEIGHTS_FSEXEC ? rt_st_read_part(path, t, n, also, n_also, err, errlen)
                                                : rt_hf_read(path, fmt, t, n, also, n_also, err, errlen);
    plan_dealloc(t);
    plan_dealloc(also);
    json_decref(map);
    /* Each storage takes the part it holds on this rank. */
    for (int32_t i = 0; i < p->n_tensors && !rc; i++) {
        if (p->tensors[i].role != PLAN_ROLE_PARAM || !rt_flat_is_storage(p, i)) continue;
        int64_t first, count;
        rt_flat_held(&p->tensors[i], rt_exec_rank(e), &first, &count);
        memcpy(rt_exec_data(e, i), f.full[p->tensors[i].unit] + first, sizeof(float) * (size_t)count);
    }
    flat_free(&f);
    if (rt_comm_agree(rc ? 1 : 0)) return -1;
    /* Tied params that have bytes of their own start again from their target. */
    for (int32_t i = 0; i < p->n_tensors; i++) {
        const PlanTensor *pt = &p->tensors[i];
        if (pt->role != PLAN_ROLE_PARAM || pt->tied_to == PLAN_NONE) continue;
        void *dst = rt_exec_data(e, i), *src = rt_exec_data(e, pt->tied_to);
        if (dst != src) memmove(dst, src, (size_t)plan_tensor_nbytes(pt));
    }
    rt_exec_cast_params(e);
    return 0;
}
