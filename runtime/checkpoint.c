/* runtime/checkpoint.c: checkpoints on disk: writing one, finding and checking one, its
 * index of pieces (the export is ckexport.c's, the directory as a whole ckdir.c's, the
 * file handling, never through a link, ckfs.c's). Loading one into a plan (any plan of the
 * same model) is resume.c's.
 *
 *   DIR/step-00000300/rank-00000.safetensors   what world rank 0 owns (state.c's pieces)
 *   DIR/step-00000300/rank-00001.safetensors   ...
 *   DIR/step-00000300/manifest.json            written last: the commit marker
 *
 * Each rank writes only the pieces it owns (no gather: a rank's memory is its own state),
 * straight from its arena, as a safetensors file: a piece that is a whole tensor under
 * the tensor's name and shape ("h.0.attn.w"), a part as its flat elements under
 * "NAME[a:b]" (1-D: what torch's w.flatten()[a:b] holds). The file's metadata "fsexec"
 * is JSON: the step, the plan's hash, the rank, and for every piece its tensor, kind,
 * element range, logical shape and CRC-32. Every file is written atomically (ckfs_write:
 * a complete temporary file renamed over its name); once every rank's is, rank 0 writes
 * manifest.json (also so): the step,
 * the topology of the plan that saved it, the seed and the data, and every file with its
 * size and its header's CRC-32. A checkpoint without its manifest does not exist: a kill
 * at any moment leaves the previous one whole. A save over a committed checkpoint of the
 * same step writes the other generation's rank file names (ckdir.c), so that one stays
 * whole until the new manifest is renamed over its own; a failed save removes what it
 * wrote. Older checkpoints go (--keep) only once the new one is committed, manifest first.
 *
 * The data cursor is the step: a step's batch is a function of (seed, step) alone
 * (data.c), and so is every random number (the counter-based RNG is keyed by seed and
 * position; dropout's masks by seed, step, op and element). The seed is in the manifest.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "record.h"
#include "runtime.h"

#define FORMAT "fsexec-checkpoint"
enum { VERSION = 1, MAX_MANIFEST = 64 << 20 };

/* Where a save writes: its step directory, open, and the generation of its rank files. */
typedef struct {
    int fd;
    const char *shown;       // DIR/step-NNNNNNNN, for messages
    int gen;
} StepDir;

uint64_t rt_plan_hash(const Plan *p)
{
    uint64_t h = PLAN_FNV1A_INIT;
    for (int32_t i = 0; i < p->n_sections; i++) {
        h = plan_fnv1a(h, p->sections[i].tag, 4);
        h = plan_fnv1a(h, &p->sections[i].crc, sizeof p->sections[i].crc);
    }
    return h;
}

/* ---- saving ------------------------------------------------------------------------ */

/* "NAME" for a whole tensor, "NAME[a:b]" for a part. */
static char *piece_key(const RtPiece *x)
{
    int64_t n = 1;
    for (int d = 0; d < x->rank; d++) n *= x->shape[d];
    size_t len = strlen(x->name) + 48;
    char *k = plan_alloc(len);
    if (!k) return NULL;
    if (x->first == 0 && x->count == n) snprintf(k, len, "%s", x->name);
    else snprintf(k, len, "%s[%" PRId64 ":%" PRId64 "]", x->name, x->first, x->first + x->count);
    return k;
}

/* This rank's file: its own pieces. The file's bytes, its header's CRC and the elements
 * it holds by kind into sums[0..4]. */
static int write_rank_file(const Exec *e, const StepDir *sd, int64_t step, uint64_t hash, uint64_t *sums, char *err,
                           size_t errlen)
{
    RtState *st = rt_state_new(e, err, errlen);
    if (!st) return -1;
    int32_t n = 0, total = rt_state_count(st);
    StEntry *t = plan_alloc(sizeof *t * (size_t)(total + 1));
    char **keys = plan_alloc(sizeof *keys * (size_t)(total + 1));
    int64_t *one = plan_alloc(sizeof *one * (size_t)(total + 1));
    json_t *pieces = json_object(), *meta = NULL;
    int rc = !t || !keys || !one || !pieces ? plan_fail(err, errlen, "out of memory") : 0;
    for (int32_t i = 0; i < total && !rc; i++) {
        const RtPiece *x = rt_state_piece(st, i);
        if (!x->own) continue;
        if (!(keys[n] = piece_key(x))) {
            rc = plan_fail(err, errlen, "out of memory");
            break;
        }
        int whole = !strcmp(keys[n], x->name);
        one[n] = x->count;
        t[n] = (StEntry){keys[n], x->dtype, whole ? x->rank : 1, whole ? x->shape : &one[n], x->data};
        size_t bytes = (size_t)x->count * (size_t)plan_dtype_size(x->dtype);
        char crc[16];
        snprintf(crc, sizeof crc, "%08x", plan_crc32(0, x->data, bytes));
        json_t *shape = json_array();
        for (int d = 0; d < x->rank && shape; d++) json_array_append_new(shape, json_integer(x->shape[d]));
        json_t *d = shape ? json_pack("{s:s,s:s,s:I,s:I,s:o,s:s}", "tensor", x->name, "kind", rt_state_kind_name(x->kind),
                                      "first", (json_int_t)x->first, "count", (json_int_t)x->count, "shape", shape,
                                      "crc32", crc)
                          : NULL;
        if (!d || json_object_set_new(pieces, keys[n], d)) rc = plan_fail(err, errlen, "out of memory");
        sums[2 + x->kind] += (uint64_t)x->count;
        n++;
    }
    char h[24], *text = NULL;
    snprintf(h, sizeof h, "%016" PRIx64, hash);
    if (!rc) {
        meta = json_pack("{s:s,s:i,s:I,s:s,s:i,s:O}", "format", FORMAT "-shard", "version", VERSION, "step",
                         (json_int_t)step, "plan", h, "rank", rt_comm_rank(), "pieces", pieces);
        text = meta ? json_dumps(meta, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        if (!text) rc = plan_fail(err, errlen, "out of memory");
    }
    uint8_t *head = NULL;
    size_t hlen = 0;
    char s[32];
    snprintf(s, sizeof s, "%" PRId64, step);
    const char *kv[] = {"step", s, "fsexec", text};
    if (!rc && rt_st_header(t, n, kv, 2, &head, &hlen)) rc = plan_fail(err, errlen, "out of memory building the header");
    PlanChunk *chunks = rc ? NULL : plan_alloc(sizeof *chunks * (size_t)(n + 1));
    if (!rc && !chunks) rc = plan_fail(err, errlen, "out of memory");
    if (!rc) {
        uint64_t size = hlen;
        chunks[0] = (PlanChunk){head, hlen};
        for (int32_t i = 0; i < n; i++) {
            int64_t m = 1;
            for (int d = 0; d < t[i].rank; d++) m *= t[i].shape[d];
            chunks[i + 1] = (PlanChunk){t[i].data, (size_t)m * (size_t)plan_dtype_size(t[i].dtype)};
            size += chunks[i + 1].len;
        }
        char name[64];
        rc = ckfs_write(sd->fd, sd->shown, ck_rank_file(rt_comm_rank(), sd->gen, name, sizeof name), chunks, n + 1, err,
                        errlen);
        sums[0] = size, sums[1] = plan_crc32(0, head, hlen);
    }
    plan_dealloc(chunks);
    plan_dealloc(head);
    free(text);
    json_decref(meta);
    json_decref(pieces);
    for (int32_t i = 0; keys && i < n; i++) plan_dealloc(keys[i]);
    plan_dealloc(keys);
    plan_dealloc(t);
    plan_dealloc(one);
    rt_state_free(st);
    return rc;
}

enum { SUMS = 2 + RT_STATE_COUNT };  // per rank: file bytes, header CRC, elements by kind

static int write_manifest(const Exec *e, const StepDir *sd, int64_t step, uint64_t hash, const uint64_t *sums,
                          int world,
                          const RtCheckpointOptions *o, char *err, size_t errlen)
{
    const Plan *w = rt_exec_whole(e);
    char h[24], name[64], crc[16];
    snprintf(h, sizeof h, "%016" PRIx64, hash);
    json_t *files = json_array();
    uint64_t elems[RT_STATE_COUNT] = {0}, bytes = 0;
    for (int r = 0; r < world && files; r++) {
        const uint64_t *s = sums + (size_t)r * SUMS;
        snprintf(crc, sizeof crc, "%08" PRIx32, (uint32_t)s[1]);
        json_array_append_new(files, json_pack("{s:s,s:i,s:I,s:s}", "name", ck_rank_file(r, sd->gen, name, sizeof name),
                                               "rank", r,
                                               "bytes", (json_int_t)s[0], "header_crc32", crc));
        for (int k = 0; k < RT_STATE_COUNT; k++) elems[k] += s[2 + k];
        bytes += s[0];
    }
    RtLayout l;
    if (rt_plan_layout(w, &l, err, errlen)) {
        json_decref(files);
        return -1;
    }
    json_t *m = json_pack(
        "{s:s,s:i,s:I,s:s,s:{s:s,s:i,s:i,s:i,s:s,s:s,s:I,s:s},s:I,s:{s:s,s:s,s:I},s:{s:s,s:I},s:{s:I,s:I,s:I},s:I,s:o}",
        "format", FORMAT, "version", VERSION, "step", (json_int_t)step, "model", plan_meta_str(w, "model", "model"),
        "plan", "hash", h, "world", l.world, "stages", l.stages, "dp", l.dp, "shard", plan_meta_str(w, "shard", "none"),
        "precision", plan_meta_str(w, "precision", "fp32"), "microbatches",
        (json_int_t)plan_meta_int(w, "microbatches", 1), "offload", plan_meta_str(w, "offload", "none"), "seed",
        (json_int_t)o->seed, "data", "source", o->data ? o->data : "", "order",
        o->order == RT_ORDER_SEQUENTIAL ? "sequential" : "random", "next_step", (json_int_t)(step + 1), "rng", "kind",
        "philox4x32-10 keyed by (seed, position): no state beyond the seed and the step", "seed", (json_int_t)o->seed,
        "elements", "params", (json_int_t)elems[RT_STATE_PARAM], "optimizer", (json_int_t)elems[RT_STATE_OPTIM],
        "state", (json_int_t)elems[RT_STATE_OTHER], "bytes", (json_int_t)bytes, "files", files);
    json_t *model = m ? rt_record_model(w) : NULL, *data = m ? rt_record_data(o->data_path) : NULL;
    if (!model || !data || json_object_set(m, "model_check", model) ||
        json_object_update(json_object_get(m, "data"), data))
        json_decref(m), m = NULL;  // the records cannot be made: out of memory
    json_decref(model);
    json_decref(data);
    char *text = m ? json_dumps(m, JSON_INDENT(2)) : NULL;
    json_decref(m);
    if (!text) return plan_fail(err, errlen, "out of memory writing the manifest");
    size_t len = strlen(text);
    text[len] = '\n';  // json_dumps ends the text with its NUL: a newline in its place
    PlanChunk c = {text, len + 1};
    int rc = ckfs_write(sd->fd, sd->shown, MANIFEST, &c, 1, err, errlen);  // the commit
    free(text);
    return rc;
}

/* The generation a save into the step directory at writes: the other one than its
 * committed checkpoint's, so that checkpoint stays whole until the new manifest
 * replaces its own (a save that fails or is killed before then leaves it as it was). */
static int next_generation(int at)
{
    int64_t size;
    char why[512];
    int fd = ckfs_open(at, "", MANIFEST, &size, why, sizeof why);
    if (fd < 0) return 0;
    json_error_t je;
    json_t *m = json_loadfd(fd, 0, &je);
    close(fd);
    const char *first = json_string_value(json_object_get(json_array_get(json_object_get(m, "files"), 0), "name"));
    int gen = first && ck_generation_of(first) == 0;
    json_decref(m);
    return gen;
}

/* Rank 0's part before the ranks write: the checkpoint directory (made when new), room
 * for the checkpoint in it, the step directory (made when new, never through a link) and
 * its generation. 0, or -1 with a message. */
static int prepare(const RtCheckpointOptions *o, const char *name, int *root, StepDir *sd, char *err, size_t errlen)
{
    if ((*root = ckfs_root(o->dir, 1, err, errlen)) < 0) return -1;
    if (o->bytes > 0 && ckfs_room(*root, o->dir, (uint64_t)o->bytes, err, errlen)) return -1;
    if ((sd->fd = ckfs_dir(*root, o->dir, name, 1, NULL, err, errlen)) < 0) return -1;
    sd->gen = next_generation(sd->fd);
    return 0;
}

/* What a failed save of generation gen left in its step directory goes: its rank files
 * and temporary files, and the directory itself when no committed checkpoint is in it. */
static void abandon(int root, const StepDir *sd, const char *name)
{
    if (root < 0 || sd->fd < 0) return;
    ck_remove_files(sd->fd, sd->gen);
    if (!S_ISREG(ckfs_mode(sd->fd, MANIFEST))) unlinkat(root, name, AT_REMOVEDIR);
}

int rt_checkpoint_save(const Exec *e, int64_t step, const RtCheckpointOptions *o, RtSaved *out, char *err,
                       size_t errlen)
{
    double t0 = rt_now();
    int rank = rt_comm_rank(), world = rt_comm_world(), root = -1;
    uint64_t hash = rt_plan_hash(rt_exec_whole(e));
    char sdir[4200], name[32];
    ck_step_name(step, name, sizeof name);
    snprintf(sdir, sizeof sdir, "%s/%s", o->dir, name);
    StepDir sd = {.fd = -1, .shown = sdir};
    err[0] = 0;
    uint64_t mine[SUMS] = {0}, *all = plan_alloc(sizeof *all * SUMS * (size_t)world);
    int rc = !all ? plan_fail(err, errlen, "out of memory") : rank == 0 ? prepare(o, name, &root, &sd, err, errlen) : 0;
    int failed = rt_comm_agree(rc ? 1 : 0);
    if (!failed) {  // rank 0's generation to every rank; then each opens the step directory itself
        uint64_t gen = (uint64_t)sd.gen;
        rt_comm_allgather_u64(&gen, 1, all);
        sd.gen = (int)all[0];
        if (rank && (root = ckfs_root(o->dir, 0, err, errlen)) >= 0)
            sd.fd = ckfs_dir(root, o->dir, name, 0, NULL, err, errlen);
        rc = sd.fd < 0 ? -1 : write_rank_file(e, &sd, step, hash, mine, err, errlen);
        failed = rt_comm_agree(rc ? 1 : 0);
    }
    if (!failed) {
        rt_comm_allgather_u64(mine, SUMS, all);
        rc = rank == 0 ? write_manifest(e, &sd, step, hash, all, world, o, err, errlen) : 0;
        failed = rt_comm_agree(rc ? 1 : 0);
    }
    if (!failed && out) {
        memset(out, 0, sizeof *out);
        for (int r = 0; r < world; r++) out->bytes += (int64_t)all[(size_t)r * SUMS];
        out->files = world;
        snprintf(out->path, sizeof out->path, "%.4000s", sdir);
    }
    if (rank == 0 && failed) abandon(root, &sd, name);
    if (rank == 0 && !failed) {  // committed: the previous generation's files, then older checkpoints (--keep)
        ck_remove_files(sd.fd, !sd.gen);
        ck_prune(root, step, o->keep);
    }
    if (sd.fd >= 0) close(sd.fd);
    if (root >= 0) close(root);
    plan_dealloc(all);
    if (failed) return -1;
    if (out) out->seconds = rt_now() - t0;
    return 0;
}

/* ---- opening ----------------------------------------------------------------------- */

static int by_piece(const void *a, const void *b)
{
    const CkPiece *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : x->first < y->first ? -1 : x->first > y->first;
}

static int kind_of(const char *s, RtStateKind *k)
{
    for (int i = 0; i < RT_STATE_COUNT; i++)
        if (!strcmp(s, rt_state_kind_name((RtStateKind)i))) return *k = (RtStateKind)i, 0;
    return -1;
}

int ck_fail_file(const RtCheckpoint *c, int32_t f, char *err, size_t errlen, const char *what)
{
    const char *name = json_string_value(json_object_get(json_array_get(json_object_get(c->manifest, "files"),
                                                                        (size_t)f), "name"));
    return plan_fail(err, errlen, "%s/%s: %s", c->dir, name ? name : "?", what);
}

/* File f's pieces into c->pieces (room made by the caller), each checked against the
 * tensor the file holds under its key. */
static int index_file(RtCheckpoint *c, int32_t f, char *err, size_t errlen)
{
    char why[512];
    json_t *pieces = json_object_get(c->meta[f], "pieces");
    const char *key;
    json_t *v;
    if (!json_is_object(pieces)) return ck_fail_file(c, f, err, errlen, "its metadata lists no pieces");
    json_object_foreach(pieces, key, v)
    {
        const StTensor *t = NULL;
        for (size_t i = 0; i < rt_st_count(c->files[f]) && !t; i++)
            if (!strcmp(rt_st_tensor(c->files[f], i)->name, key)) t = rt_st_tensor(c->files[f], i);
        CkPiece *x = &c->pieces[c->n_pieces];
        json_t *shape = json_object_get(v, "shape");
        const char *tensor = json_string_value(json_object_get(v, "tensor"));
        const char *kind = json_string_value(json_object_get(v, "kind"));
        const char *crc = json_string_value(json_object_get(v, "crc32"));
        json_t *first = json_object_get(v, "first"), *count = json_object_get(v, "count");
        if (!t) {
            snprintf(why, sizeof why, "its metadata lists '%s', which it does not hold", key);
            return ck_fail_file(c, f, err, errlen, why);
        }
        if (!tensor || !kind || kind_of(kind, &x->kind) || !crc || strlen(crc) != 8 || !json_is_integer(first) ||
            !json_is_integer(count) || !json_is_array(shape) || json_array_size(shape) > PLAN_MAX_RANK) {
            snprintf(why, sizeof why, "the metadata of '%s' is damaged", key);
            return ck_fail_file(c, f, err, errlen, why);
        }
        x->name = tensor, x->key = key, x->file = f, x->dtype = t->dtype, x->begin = t->begin, x->end = t->end;
        x->first = json_integer_value(first), x->count = json_integer_value(count);
        x->crc = (uint32_t)strtoul(crc, NULL, 16);
        x->rank = (int)json_array_size(shape);
        int64_t n = 1;
        for (int d = 0; d < x->rank; d++) {
            json_t *s = json_array_get(shape, (size_t)d);
            x->shape[d] = json_is_integer(s) ? json_integer_value(s) : -1;
            if (x->shape[d] < 0 || (x->shape[d] && n > INT64_MAX / x->shape[d])) {
                snprintf(why, sizeof why, "the metadata of '%s' has a bad shape", key);
                return ck_fail_file(c, f, err, errlen, why);
            }
            n *= x->shape[d];
        }
        int64_t held = 1;
        for (int d = 0; d < t->rank; d++) held *= t->shape[d];
        if (x->first < 0 || x->count < 0 || x->first > n - x->count || held != x->count) {
            snprintf(why, sizeof why, "piece '%s' holds %" PRId64 " elements, its metadata says [%" PRId64 ", +%" PRId64
                     ") of %" PRId64, key, held, x->first, x->count, n);
            return ck_fail_file(c, f, err, errlen, why);
        }
        c->n_pieces++;
    }
    return 0;
}

/* The pieces of every logical tensor tile it: from element 0 to its end, in one shape
 * and dtype, without a gap or an overlap. */
static int check_tiling(const RtCheckpoint *c, char *err, size_t errlen)
{
    for (int32_t i = 0; i < c->n_pieces;) {
        const CkPiece *x = &c->pieces[i];
        int64_t n = 1, at = 0;
        for (int d = 0; d < x->rank; d++) n *= x->shape[d];
        int32_t j = i;
        for (; j < c->n_pieces && !strcmp(c->pieces[j].name, x->name); j++) {
            const CkPiece *y = &c->pieces[j];
            int same = y->rank == x->rank && y->dtype == x->dtype && y->kind == x->kind;
            for (int d = 0; same && d < x->rank; d++) same = y->shape[d] == x->shape[d];
            if (!same)
                return plan_fail(err, errlen, "%s: the pieces of '%s' disagree on its shape, dtype or kind", c->dir,
                                 x->name);
            if (y->first != at)
                return plan_fail(err, errlen, "%s: '%s' elements %s %" PRId64 " (its pieces %s)", c->dir, x->name,
                                 y->first > at ? "missing from" : "twice at", at,
                                 y->first > at ? "leave a gap: a rank's file is missing or from another save"
                                               : "overlap");
            at += y->count;
        }
        if (at != n)
            return plan_fail(err, errlen, "%s: '%s' has %" PRId64 " of its %" PRId64 " elements", c->dir, x->name, at, n);
        i = j;
    }
    return 0;
}

/* Every file the manifest names: its size and header CRC as the manifest says, its
 * metadata of this checkpoint, its pieces indexed. */
static int open_files(RtCheckpoint *c, int at, char *err, size_t errlen)
{
    json_t *files = json_object_get(c->manifest, "files");
    const char *hash = json_string_value(json_object_get(json_object_get(c->manifest, "plan"), "hash"));
    if (!json_is_array(files) || !json_array_size(files) || !hash)
        return plan_fail(err, errlen, "%s/" MANIFEST ": no files listed, or no plan hash (damaged)", c->dir);
    c->n_files = (int32_t)json_array_size(files);
    c->files = plan_alloc(sizeof *c->files * (size_t)c->n_files);
    c->meta = plan_alloc(sizeof *c->meta * (size_t)c->n_files);
    c->ident = plan_alloc(sizeof *c->ident * 2 * (size_t)(c->n_files + 1));
    if (!c->files || !c->meta || !c->ident) return plan_fail(err, errlen, "out of memory");
    memset(c->ident, 0, sizeof *c->ident * 2 * (size_t)(c->n_files + 1));
    memset(c->files, 0, sizeof *c->files * (size_t)c->n_files);
    memset(c->meta, 0, sizeof *c->meta * (size_t)c->n_files);
    size_t total = 0;
    char path[8192], why[512];
    for (int32_t f = 0; f < c->n_files; f++) {
        json_t *e = json_array_get(files, (size_t)f);
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *crc = json_string_value(json_object_get(e, "header_crc32"));
        json_t *bytes = json_object_get(e, "bytes");
        if (!name || !crc || !json_is_integer(bytes))
            return plan_fail(err, errlen, "%s/" MANIFEST ": file %d: needs \"name\", \"bytes\" and \"header_crc32\"",
                             c->dir, f);
        if (!ckfs_plain_name(name))
            return plan_fail(err, errlen, "%s/" MANIFEST ": file %d's name leaves the checkpoint directory (a "
                             "checkpoint's files are in its own directory: damaged, or made to point elsewhere)",
                             c->dir, f);
        snprintf(path, sizeof path, "%s/%s", c->dir, name);
        int64_t size;
        struct stat st;
        int fd = ckfs_open(at, c->dir, name, &size, err, errlen);
        if (fd < 0) return -1;
        if (!fstat(fd, &st)) c->ident[2 * f + 2] = (uint64_t)st.st_dev, c->ident[2 * f + 3] = (uint64_t)st.st_ino;
        if (!(c->files[f] = rt_st_open_fd(fd, size, why, sizeof why))) {
            if (size != json_integer_value(bytes))
                return plan_fail(err, errlen, "%s: %" PRId64 " bytes where the manifest says %" PRId64
                                 " (truncated or replaced): %s", path, size, (int64_t)json_integer_value(bytes), why);
            return plan_fail(err, errlen, "%s: %s", path, why);
        }
        if ((int64_t)rt_st_size(c->files[f]) != json_integer_value(bytes))
            return plan_fail(err, errlen, "%s: %" PRIu64 " bytes where the manifest says %" PRId64
                             " (truncated or replaced)", path, rt_st_size(c->files[f]),
                             (int64_t)json_integer_value(bytes));
        /* Whose file it is first (a copy from another checkpoint passes every check of
         * its own), then whether its header is the one the manifest saw. */
        const char *meta = rt_st_meta(c->files[f], "fsexec");
        json_error_t je;
        c->meta[f] = meta ? json_loads(meta, 0, &je) : NULL;
        const char *fh = json_string_value(json_object_get(c->meta[f], "plan"));
        json_t *step = json_object_get(c->meta[f], "step");
        if (fh && json_is_integer(step) && (strcmp(fh, hash) || json_integer_value(step) != c->step))
            return plan_fail(err, errlen, "%s: saved at step %" PRId64 " by plan %s, but the manifest is of step %"
                             PRId64 " by plan %s: a file of another checkpoint", path,
                             (int64_t)json_integer_value(step), fh, c->step, hash);
        if (rt_st_header_crc(c->files[f]) != (uint32_t)strtoul(crc, NULL, 16))
            return plan_fail(err, errlen, "%s: its header's CRC-32 is %08" PRIx32 ", the manifest says %s (the header "
                             "is damaged)", path, rt_st_header_crc(c->files[f]), crc);
        if (!c->meta[f] || !fh || !json_is_integer(step))
            return plan_fail(err, errlen, "%s: not a checkpoint shard of fsexec (no \"fsexec\" metadata)", path);
        total += json_object_size(json_object_get(c->meta[f], "pieces"));
    }
    if (!(c->pieces = plan_alloc(sizeof *c->pieces * (total + 1)))) return plan_fail(err, errlen, "out of memory");
    for (int32_t f = 0; f < c->n_files; f++)
        if (index_file(c, f, err, errlen)) return -1;
    qsort(c->pieces, (size_t)c->n_pieces, sizeof *c->pieces, by_piece);
    return check_tiling(c, err, errlen);
}

/* The manifest of the step directory at (never a link, at most MAX_MANIFEST bytes) as
 * JSON, its file's (st_dev, st_ino) into id; NULL with a message. */
static json_t *read_manifest(const RtCheckpoint *c, int at, const char *mpath, uint64_t *id, char *err, size_t errlen)
{
    int64_t size, got = 0;
    struct stat st;
    int fd = ckfs_open(at, c->dir, MANIFEST, &size, err, errlen);
    if (fd < 0) return NULL;
    if (!fstat(fd, &st)) id[0] = (uint64_t)st.st_dev, id[1] = (uint64_t)st.st_ino;
    char *text = size <= MAX_MANIFEST ? plan_alloc((size_t)size + 1) : NULL;
    for (ssize_t k = 1; text && got < size && k > 0; got += k > 0 ? k : 0)
        if ((k = read(fd, text + got, (size_t)(size - got))) < 0 && errno == EINTR) k = 0;
    close(fd);
    got = text && got == size;
    json_error_t je;
    json_t *m = got ? json_loadb(text, (size_t)size, JSON_REJECT_DUPLICATES, &je) : NULL;
    plan_dealloc(text);
    char why[JSON_ERROR_TEXT_LENGTH];
    if (size > MAX_MANIFEST) plan_fail(err, errlen, "%s: %" PRId64 " bytes; a manifest is at most %d", mpath, size,
                                       MAX_MANIFEST);
    else if (!got) plan_fail(err, errlen, "%s: cannot read it", mpath);
    else if (!m) plan_fail(err, errlen, "%s: not valid JSON at byte %d (line %d): %s", mpath, je.position, je.line,
                           plan_json_why(je.text, why, sizeof why));
    return m;
}

/* The step directory path names (it holds a manifest.json, of any kind: a link there is
 * an error, not another directory), or the newest complete one in the checkpoint
 * directory path; its descriptor, c->dir set, or -1 with a message. */
static int find_step(RtCheckpoint *c, const char *path, char *err, size_t errlen)
{
    int root = ckfs_root(path, 0, err, errlen);
    if (root < 0) return -1;
    if (ckfs_mode(root, MANIFEST)) {
        snprintf(c->dir, sizeof c->dir, "%s", path);
        return root;
    }
    int incomplete;
    char name[32];
    int64_t s = ck_newest(root, path, &incomplete, err, errlen);
    int at = s >= 0 ? ckfs_dir(root, path, ck_step_name(s, name, sizeof name), 0, NULL, err, errlen) : -1;
    if (s == -1)
        plan_fail(err, errlen, "%s: no checkpoint in it (a step-NNNNNNNN directory with a " MANIFEST ")%s", path,
                  incomplete ? "; the incomplete ones were cut off while being saved" : "");
    else if (s >= 0)
        snprintf(c->dir, sizeof c->dir, "%s/%s", path, name);
    close(root);
    return at;
}

RtCheckpoint *rt_checkpoint_open(const char *path, char *err, size_t errlen)
{
    RtCheckpoint *c = plan_alloc(sizeof *c);
    if (!c) {
        plan_fail(err, errlen, "out of memory");
        return NULL;
    }
    memset(c, 0, sizeof *c);
    char mpath[4096 + 32];
    int at = find_step(c, path, err, errlen), rc = at < 0 ? -1 : 0;
    snprintf(mpath, sizeof mpath, "%s/" MANIFEST, c->dir);
    uint64_t id[2] = {0, 0};
    if (!rc && !(c->manifest = read_manifest(c, at, mpath, id, err, errlen))) rc = -1;
    json_t *format = json_object_get(c->manifest, "format"), *version = json_object_get(c->manifest, "version");
    json_t *step = json_object_get(c->manifest, "step"), *seed = json_object_get(c->manifest, "seed");
    if (!rc && (!json_is_string(format) || strcmp(json_string_value(format), FORMAT)))
        rc = plan_fail(err, errlen, "%s: not an fsexec checkpoint manifest", mpath);
    if (!rc && (!json_is_integer(version) || json_integer_value(version) != VERSION))
        rc = plan_fail(err, errlen, "%s: checkpoint format version %" PRId64 "; this fsexec reads version %d", mpath,
                       json_is_integer(version) ? (int64_t)json_integer_value(version) : -1, VERSION);
    if (!rc && (!json_is_integer(step) || json_integer_value(step) < 0 || !json_is_integer(seed)))
        rc = plan_fail(err, errlen, "%s: no step or seed (damaged)", mpath);
    if (!rc) {
        c->step = json_integer_value(step);
        c->seed = (uint64_t)json_integer_value(seed);
        rc = open_files(c, at, err, errlen);
        if (c->ident) c->ident[0] = id[0], c->ident[1] = id[1];
    }
    if (at >= 0) close(at);
    if (rc) {
        rt_checkpoint_close(c);
        return NULL;
    }
    return c;
}

const char *rt_checkpoint_holds(const RtCheckpoint *c, const char *path)
{
    struct stat st;
    if (stat(path, &st)) return NULL;
    for (int32_t f = -1; f < c->n_files; f++)
        if (c->ident[2 * f + 2] == (uint64_t)st.st_dev && c->ident[2 * f + 3] == (uint64_t)st.st_ino)
            return f < 0 ? MANIFEST
                         : json_string_value(json_object_get(json_array_get(json_object_get(c->manifest, "files"),
                                                                            (size_t)f), "name"));
    return NULL;
}

void rt_checkpoint_close(RtCheckpoint *c)
{
    if (!c) return;
    for (int32_t f = 0; c->files && f < c->n_files; f++) rt_st_close(c->files[f]);
    for (int32_t f = 0; c->meta && f < c->n_files; f++) json_decref(c->meta[f]);
    plan_dealloc(c->files);
    plan_dealloc(c->meta);
    plan_dealloc(c->pieces);
    plan_dealloc(c->ident);
    json_decref(c->manifest);
    plan_dealloc(c);
}

const char *rt_checkpoint_dir(const RtCheckpoint *c) { return c->dir; }
const json_t *rt_checkpoint_manifest(const RtCheckpoint *c) { return c->manifest; }
int64_t rt_checkpoint_step(const RtCheckpoint *c) { return c->step; }
uint64_t rt_checkpoint_seed(const RtCheckpoint *c) { return c->seed; }

const char *rt_checkpoint_info(const RtCheckpoint *c, const char *key)
{
    json_t *plan = json_object_get(c->manifest, "plan"), *v = json_object_get(plan, key);
    if (!v) v = json_object_get(json_object_get(c->manifest, "data"), key);
    if (!v) v = json_object_get(c->manifest, key);
    return json_string_value(v);
}

int64_t rt_checkpoint_info_int(const RtCheckpoint *c, const char *key, int64_t def)
{
    json_t *v = json_object_get(json_object_get(c->manifest, "plan"), key);
    if (!v) v = json_object_get(c->manifest, key);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : def;
}

int32_t rt_checkpoint_count(const RtCheckpoint *c) { return c->n_pieces; }

void rt_checkpoint_piece(const RtCheckpoint *c, int32_t i, RtPiece *out)
{
    const CkPiece *x = &c->pieces[i];
    *out = (RtPiece){.name = x->name, .kind = x->kind, .dtype = x->dtype, .rank = x->rank, .shape = x->shape,
                     .first = x->first, .count = x->count, .holder = PLAN_NONE};
}

int32_t rt_checkpoint_find(const RtCheckpoint *c, const char *name)
{
    int32_t lo = 0, hi = c->n_pieces;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (strcmp(c->pieces[mid].name, name) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo < c->n_pieces && !strcmp(c->pieces[lo].name, name) ? lo : -1;
}

int rt_checkpoint_read(const RtCheckpoint *c, int32_t i, void *buf, char *err, size_t errlen)
{
    const CkPiece *x = &c->pieces[i];
    if (rt_st_pread(c->files[x->file], buf, x->end - x->begin, x->begin))
        return ck_fail_file(c, x->file, err, errlen, "cannot read it (truncated since it was opened?)");
    uint32_t got = plan_crc32(0, buf, (size_t)(x->end - x->begin));
    char why[512];
    if (got == x->crc)
        return rt_state_check(x->name, x->kind, x->dtype, buf, x->first, x->count, c->step, why, sizeof why)
                   ? ck_fail_file(c, x->file, err, errlen, why)
                   : 0;
    snprintf(why, sizeof why, "tensor '%s' (bytes %" PRIu64 " to %" PRIu64 " of the file) has CRC-32 %08" PRIx32
             ", saved as %08" PRIx32 ": the file is damaged", x->key, x->begin, x->end, got, x->crc);
    return ck_fail_file(c, x->file, err, errlen, why);
}
