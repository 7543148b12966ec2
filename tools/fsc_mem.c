/* tools/fsc_mem.c: fsc's side of the memory report. The report itself (report/) is
 * computed from the plan, as fsexec --inspect computes it; this file builds nothing but
 * the what-ifs of --mem-limit: for each setting that this fsc implements and that could
 * cut the arena, the whole compiler pipeline runs again in process with that one
 * setting changed, and the arena it plans is compared with this one. A setting whose
 * pass does not exist yet is never offered. The text report's vocabulary padding line
 * compares the arena the same way, with --pad_vocab 0, and its line on the 16-bit params
 * the updates keep, with --cast_in_update 0.
 */
#include <stdlib.h>
#include <string.h>

#include "ast.h"
#include "codegen.h"
#include "fsc_mem.h"
#include "passes.h"
#include "report.h"

enum { MAX_WHAT_IFS = 10, MAX_OPTS = 512 };

int fsc_set_source(Plan *p, const char *path)
{
    const char *slash = strrchr(path, '/');
    return plan_meta_set_str(p, "source", slash ? slash + 1 : path);
}

static int has_pass(const char *name)
{
    int n;
    const PassInfo *p = passes_list(&n);
    for (int i = 0; i < n; i++)
        if (!strcmp(p[i].name, name)) return 1;
    return 0;
}

/* The device arena (what the limit is on) of the largest stage: the graph's own, or
 * the largest of its stages' when the compiler cut it into several. */
static int64_t largest_arena(const Graph *g)
{
    int64_t n = g->n_stage_graphs ? 0 : g->space_bytes[PLACE_DEVICE];
    for (int s = 0; s < g->n_stage_graphs; s++)
        if (g->stage_graphs[s]->space_bytes[PLACE_DEVICE] > n) n = g->stage_graphs[s]->space_bytes[PLACE_DEVICE];
    return n;
}

/* The arena of the model compiled with one more -D (replacing one of the same name) or
 * one more setting; -1 when that does not compile. Messages go nowhere. */
static int64_t arena_with(const FscMem *m, const Define *def, const Setting *set, int n_set)
{
    const FrontendOptions *fo = m->fo;
    if (fo->n_defines + 1 > MAX_OPTS || fo->n_settings + n_set > MAX_OPTS) return -1;
    Define defs[MAX_OPTS];
    Setting sets[MAX_OPTS];
    int nd = 0, ns = 0;
    for (int i = 0; i < fo->n_defines; i++)
        if (!def || strcmp(fo->defines[i].name, def->name)) defs[nd++] = fo->defines[i];
    if (def) defs[nd++] = *def;
    for (int i = 0; i < fo->n_settings; i++) sets[ns++] = fo->settings[i];
    for (int i = 0; i < n_set; i++) sets[ns++] = set[i];
    FILE *null = fopen("/dev/null", "w");
    if (!null) return -1;
    Diag d;
    diag_init(&d, m->path, m->src, m->len, null);
    FrontendOptions o2 = {defs, nd, sets, ns};
    Options o = {0};
    Graph *g = fe_compile(m->src, m->len, &o2, &o.train, &d);
    int64_t arena = g && passes_run(g, &o, &d) == 0 && !d.n_errors ? largest_arena(g) : -1;
    ir_graph_free(g);
    fclose(null);
    return arena;
}

/* The batch: the first input's first dim, when it is a plain dim name. */
static const char *batch_dim(const FscMem *m, Arena *a)
{
    FILE *null = fopen("/dev/null", "w");
    if (!null) return NULL;
    Diag d;
    diag_init(&d, m->path, m->src, m->len, null);
    Program *prog = fe_parse(m->src, m->len, a, &d);
    fclose(null);
    for (const Stmt *st = prog ? prog->body : NULL; st; st = st->next)
        if (st->kind == ST_INPUT) return st->shape && st->shape->kind == EX_NAME ? st->shape->name : NULL;
    return NULL;
}

static int64_t first_input_rows(const Plan *p)
{
    for (int32_t i = 0; i < p->n_tensors; i++)
        if (p->tensors[i].role == PLAN_ROLE_INPUT && p->tensors[i].rank > 0) return p->tensors[i].shape[0];
    return 0;
}

static void try_batch(const FscMem *m, const Plan *p, MemWhatIf *w, int *n)
{
    Arena *a = arena_new();
    const char *dim = batch_dim(m, a);
    int64_t dp = p->n_programs ? p->programs[0].dp_world : 1, global = first_input_rows(p) * (dp > 1 ? dp : 1);
    if (dim && global >= 2) {
        Define def = {dim, global / 2};
        MemWhatIf *x = &w[(*n)++];
        snprintf(x->flags, sizeof x->flags, "-D %s=%lld", dim, (long long)(global / 2));
        snprintf(x->what, sizeof x->what, "half the batch (%s %lld -> %lld)", dim, (long long)global,
                 (long long)(global / 2));
        x->arena = arena_with(m, &def, NULL, 0);
        x->changes_training = 1;
    }
    arena_free(a);
}

static void try_setting(const FscMem *m, MemWhatIf *w, int *n, const Setting *s, int n_s, const char *flags,
                        const char *what)
{
    MemWhatIf *x = &w[(*n)++];
    snprintf(x->flags, sizeof x->flags, "%s", flags);
    snprintf(x->what, sizeof x->what, "%s", what);
    x->arena = arena_with(m, NULL, s, n_s);
    x->changes_training = 0;
}

/* Gradient accumulation: the same training from smaller micro-batches. The next two
 * counts that split each rank's rows evenly. */
static void try_microbatches(const FscMem *m, const Plan *p, MemWhatIf *w, int *n)
{
    int64_t rows = first_input_rows(p), cur = plan_meta_int(p, "microbatches", 1);
    if (plan_meta_int(p, "stages", 1) > 1 || cur < 1) return;
    for (int64_t k = cur + 1, found = 0; k <= rows && found < 2 && *n < MAX_WHAT_IFS; k++) {
        if (rows % k) continue;
        char v[24], flags[96], what[96];
        snprintf(v, sizeof v, "%lld", (long long)k);
        snprintf(flags, sizeof flags, "--microbatches %lld", (long long)k);
        snprintf(what, sizeof what, "accumulate over %lld micro-batches of %lld rows",
                 (long long)k, (long long)(rows / k));
        Setting s = {"microbatches", v};
        try_setting(m, w, n, &s, 1, flags, what);
        found++;
    }
}

/* Each strategy that shards more than the current one, over the plan's world; from a
 * single rank, over 8 (then each rank also takes an eighth of the global batch, which
 * DDP alone shows). */
static void try_shard(const FscMem *m, const Plan *p, MemWhatIf *w, int *n)
{
    static const char *const strategies[] = {"ddp", "zero1", "zero2", "fsdp"};
    static const char *const what[] = {"data parallel, nothing sharded", "shard optimizer state (ZeRO-1)",
                                       "shard optimizer state and grads (ZeRO-2)",
                                       "shard params, grads and optimizer state (FSDP / ZeRO-3)"};
    const char *cur = plan_meta_str(p, "shard", "none");
    int64_t world = plan_meta_int(p, "world", 1);
    char ws[24], flags[96], text[96];
    snprintf(ws, sizeof ws, "%lld", (long long)(world > 1 ? world : 8));
    int from = !strcmp(cur, "zero1") ? 2 : !strcmp(cur, "zero2") ? 3 : !strcmp(cur, "fsdp") ? 4 : world > 1 ? 1 : 0;
    for (int i = from; i < 4 && *n < MAX_WHAT_IFS; i++) {
        Setting s[2] = {{"shard", strategies[i]}, {"world", ws}};
        snprintf(flags, sizeof flags, "--shard %s --world %s", strategies[i], ws);
        snprintf(text, sizeof text, "%s over %s ranks%s", what[i], ws, world > 1 ? "" : ", 1/8 of the batch each");
        try_setting(m, w, n, s, 2, flags, text);
    }
}

/* Recompute every layer the model instantiates (the first one named in its blocks). */
static void try_recompute(const FscMem *m, const Plan *p, MemWhatIf *w, int *n)
{
    if (!p->n_blocks || strcmp(plan_meta_str(p, "recompute", "none"), "none")) return;
    const char *layer = plan_str(p, p->blocks[0].layer);
    Setting s = {"recompute", layer};
    char flags[96], what[96];
    snprintf(flags, sizeof flags, "--recompute %s", layer);
    snprintf(what, sizeof what, "rerun each %s's forward in its backward (checkpointing)", layer);
    try_setting(m, w, n, &s, 1, flags, what);
}

static int what_ifs(const FscMem *m, const Plan *p, MemWhatIf *w)
{
    int n = 0;
    if (has_pass("shard")) try_shard(m, p, w, &n);
    if (has_pass("pipeline")) try_microbatches(m, p, w, &n);
    if (has_pass("recompute")) try_recompute(m, p, w, &n);
    const char *off = plan_meta_str(p, "offload", "none");
    if (has_pass("offload") && !strcmp(off, "none") && n < MAX_WHAT_IFS) {
        Setting s = {"offload", "optimizer"};
        try_setting(m, w, &n, &s, 1, "--offload optimizer",
                    "fp32 master and optimizer state on the host, the update there (ZeRO-Offload)");
    }
    if (has_pass("offload") && strcmp(off, "params") && !strcmp(plan_meta_str(p, "shard", "none"), "fsdp") &&
        n < MAX_WHAT_IFS) {
        Setting s = {"offload", "params"};
        try_setting(m, w, &n, &s, 1, "--offload params", "fsdp's param shards on the host too, staged before each gather");
    }
    /* fsdp's params outside blocks the other way (kept gathered, or gathered per use). */
    if (has_pass("shard") && !strcmp(plan_meta_str(p, "shard", "none"), "fsdp") &&
        plan_meta_int(p, "reshard_after_forward", 1) && n < MAX_WHAT_IFS) {
        int root = (int)plan_meta_int(p, "reshard_root", 0);
        Setting s = {"reshard_root", root ? "0" : "1"};
        try_setting(m, w, &n, &s, 1, root ? "--reshard_root 0" : "--reshard_root 1",
                    root ? "fsdp keeps the params outside blocks gathered from forward to backward (fewer gathers)"
                         : "fsdp gathers the params outside blocks for each use and frees them after it (ZeRO-3)");
    }
    if (n < MAX_WHAT_IFS) try_batch(m, p, w, &n);
    return n;
}

/* A head stored [C, V] that the plan reads through a padded copy (passes/pad_vocab.c: pad(param) [C, Vp]): the
 * param, and the copy's tensor in *copy; or NULL. */
static const PlanTensor *padded_copy(const Plan *p, const PlanTensor **copy)
{
    for (int32_t k = 0; k < p->n_ops; k++) {
        const PlanOp *op = &p->ops[k];
        if (strcmp(plan_str(p, op->op), "pad")) continue;
        const PlanTensor *x = &p->tensors[p->ids[op->in]];
        if (x->role != PLAN_ROLE_PARAM || x->name == PLAN_NONE || x->rank != 2) continue;
        *copy = &p->tensors[p->ids[op->out]];
        return x;
    }
    return NULL;
}

/* The largest device arena of the plan's programs. */
static int64_t plan_arena_most(const Plan *p)
{
    int64_t most = 0;
    for (int32_t g = 0; g < p->n_programs; g++)
        if (p->programs[g].space_bytes[PLAN_PLACE_DEVICE] > most) most = p->programs[g].space_bytes[PLAN_PLACE_DEVICE];
    return most;
}

/* The vocabulary padding's line (passes/pad_vocab.c), when the plan pads one: the padded
 * param's shapes (or those of the padded copy a [C, V] head is read through), and what the
 * padding adds to the (largest) device arena, against the same model compiled again with
 * --pad_vocab 0. */
static void print_padding(const Plan *p, const FscMem *m, FILE *out)
{
    const PlanTensor *t = NULL, *bias = NULL, *copy = NULL, *cols = padded_copy(p, &copy);
    for (int32_t i = 0; i < p->n_tensors; i++)
        if (p->tensors[i].role == PLAN_ROLE_PARAM && p->tensors[i].logical_rows && p->tensors[i].name != PLAN_NONE) {
            if (p->tensors[i].rank == 1 && !bias) bias = &p->tensors[i];
            if (p->tensors[i].rank > 1 && !t) t = &p->tensors[i];
        }
    if (!t && !cols) return;
    int64_t padded = plan_arena_most(p);
    Setting off = {"pad_vocab", "0"};
    int64_t plain = arena_with(m, NULL, &off, 1);
    char a[32], b[32];
    if (t) {
        int64_t rows = t->logical_rows, per_row = plan_tensor_numel(t) / t->shape[0], pad = t->shape[0] - rows;
        char with[200] = "";
        if (bias)  // the logits' bias (BERT's decoder), padded with its head
            snprintf(with, sizeof with, " and its bias %s [%lld] as [%lld]", plan_str(p, bias->name),
                     (long long)bias->logical_rows, (long long)bias->shape[0]);
        fprintf(out, "vocabulary padding (--pad_vocab %lld): %s [%lld, %lld] stored as [%lld, %lld]%s, %lld padding "
                "elements in each copy (param, gradient, optimizer state) and %lld padded logit columns\n",
                (long long)plan_meta_int(p, "pad_vocab", 0), plan_str(p, t->name), (long long)rows, (long long)per_row,
                (long long)t->shape[0], (long long)per_row, with, (long long)(pad * per_row + (bias ? pad : 0)),
                (long long)pad);
    } else {
        fprintf(out, "vocabulary padding (--pad_vocab %lld): %s [%lld, %lld] stored as it is, its GEMMs reading a "
                "padded copy [%lld, %lld] made each step (no padding in the model state) and %lld padded logit "
                "columns\n", (long long)plan_meta_int(p, "pad_vocab", 0), plan_str(p, cols->name),
                (long long)cols->shape[0], (long long)cols->shape[1], (long long)copy->shape[0],
                (long long)copy->shape[1], (long long)(copy->shape[1] - cols->shape[1]));
    }
    if (plain >= 0)
        fprintf(out, "  the padding adds %s bytes to the device arena (%s bytes with --pad_vocab 0)\n",
                report_grouped(padded - plain, a, sizeof a), report_grouped(plain, b, sizeof b));
}

/* The 16-bit params the updates write and keep between steps (cast_in_update, role
 * param16), when the plan has them: their bytes, and what keeping them costs the device
 * arena against the same model compiled again with --cast_in_update 0 (which casts them
 * from the master before their first use in each step, freed after their last). */
static void print_param16(const Plan *p, const FscMem *m, FILE *out)
{
    int64_t bytes = 0;
    for (int32_t i = 0; i < p->n_tensors; i++)
        if (p->tensors[i].role == PLAN_ROLE_PARAM16 && p->tensors[i].alias == PLAN_NONE &&
            p->tensors[i].place == PLAN_PLACE_DEVICE)
            bytes += plan_tensor_nbytes(&p->tensors[i]);
    if (!bytes) return;
    Setting off = {"cast_in_update", "0"};
    int64_t kept = plan_arena_most(p), cast = arena_with(m, NULL, &off, 1);
    char a[32], b[32], c[32];
    fprintf(out, "16-bit params kept between steps (--cast_in_update 1): %s bytes, written by each unit's update\n",
            report_grouped(bytes, a, sizeof a));
    if (cast >= 0)
        fprintf(out, "  keeping them %s %s bytes %s the device arena (%s bytes with --cast_in_update 0)\n",
                kept >= cast ? "adds" : "saves", report_grouped(kept >= cast ? kept - cast : cast - kept, b, sizeof b),
                kept >= cast ? "to" : "of", report_grouped(cast, c, sizeof c));
}

/* The page into memory first, so a failed render leaves no half-written file. With
 * --compare, the other plan is read (every check of plan_read) and its reports overlaid. */
static int write_html(const MemStages *st, const FscMem *m)
{
    char *buf = NULL, err[256];
    size_t len = 0;
    Plan *other = NULL;
    MemStages *ost = NULL;
    if (m->compare && (!(other = plan_read(m->compare, err, sizeof err)) || !(ost = report_stages_new(other, err, sizeof err)))) {
        fprintf(stderr, "fsc: error: --compare %s: %s\n", m->compare, err);
        plan_free(other);
        return 1;
    }
    FILE *mem = open_memstream(&buf, &len);
    int rc = !mem || report_stages_html_compare(st, ost, m->compare, mem) != 0;
    report_stages_free(ost);
    plan_free(other);
    if (mem && fclose(mem)) rc = 1;
    if (!rc) {
        PlanChunk c = {buf, len};
        if (plan_write_atomic(m->html_path, &c, 1, err, sizeof err)) {
            fprintf(stderr, "fsc: error: %s: %s\n", m->html_path, err);
            rc = 1;
        } else if (!m->quiet) {
            fprintf(stderr, "wrote %s\n", m->html_path);
        }
    } else {
        fprintf(stderr, "fsc: error: %s: out of memory rendering the page\n", m->html_path);
    }
    free(buf);
    return rc;
}

/* --mem-limit, on the stage with the largest arena (a plan of one program: its only). */
static int check_limit(const MemStages *st, const Plan *p, const FscMem *m)
{
    const MemReport *r = report_stages_largest(st);
    if (!report_over_limit(r, m->limit)) {
        char a[32], l[32], label[96];
        if (m->quiet) return 0;
        fprintf(stderr, "memory: arena %s per rank", report_bytes(r->arena_bytes, a, sizeof a));
        if (st->n > 1) fprintf(stderr, " on %s, the largest of the %d stages", report_label(r, label, sizeof label), st->n);
        fprintf(stderr, ", within --mem-limit %s\n", report_bytes(m->limit, l, sizeof l));
        return 0;
    }
    MemWhatIf w[MAX_WHAT_IFS];
    int n = what_ifs(m, p, w);
    fprintf(stderr, "fsc: error: --mem-limit %s: ", m->limit_text);
    report_limit_print(r, m->limit, w, n, stderr);
    return 1;
}

int fsc_mem(const Plan *p, const FscMem *m)
{
    char err[256];
    MemStages *st = report_stages_new(p, err, sizeof err);
    if (!st) {
        fprintf(stderr, "fsc: error: memory report: %s\n", err);
        return 1;
    }
    int rc = 0;
    if (m->out == MEM_OUT_TEXT) report_stages_print(st, stdout);
    if (m->out == MEM_OUT_TEXT) report_forward_print(p, stdout);
    if (m->out == MEM_OUT_TEXT) print_padding(p, m, stdout), print_param16(p, m, stdout);
    if (m->out == MEM_OUT_JSON && report_stages_json(st, stdout)) {
        fprintf(stderr, "fsc: error: could not write the JSON report\n");
        rc = 1;
    }
    if (m->out == MEM_OUT_HTML) rc = write_html(st, m);
    if (m->limit > 0 && check_limit(st, p, m)) rc = 1;
    report_stages_free(st);
    return rc;
}
