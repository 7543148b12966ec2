/* tools/fsc.c: the compiler's main. Parses flags, then frontend -> passes -> codegen ->
 * plan file, and reports. Every decision lives in a layer; this file only wires them. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen.h"
#include "cuda.h"
#include "frontend.h"
#include "fsc_mem.h"
#include "passes.h"
#include "plan.h"
#include "planner.h"
#include "report.h"

enum { MAX_SOURCE = 16 << 20, MAX_FLAGS = 256 };

typedef enum { EMIT_NONE, EMIT_IR, EMIT_IR_JSON, EMIT_CUDA } Emit;

typedef struct {
    const char *input, *output, *print_after;
    Emit emit;
    const char *emit_dir;       // --emit cuda DIR
    Define defines[MAX_FLAGS];
    int n_defines;
    Setting settings[MAX_FLAGS];
    int n_settings;
    int quiet;
    MemOut mem;                 // --mem[=text|json|html FILE]
    const char *mem_html;
    const char *compare;        // --compare PLAN: overlaid on --mem=html's page
    int64_t mem_limit;          // --mem-limit SIZE, in bytes; 0: none
    int comm;                   // --comm
    int kernels;                // --kernels: 1 text, 2 JSON
    int timeline;               // --timeline[=unit]
    TlCost timeline_cost;
    const char *mem_limit_text;
    int64_t fit;                // --fit SIZE: search the settings for the fastest plan in SIZE per rank
    const char *fit_text, *machine;  // --machine NAME|FILE
    int gpus_per_node;          // --gpus-per-node G; 0: the machine's
} Flags;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: fsc MODEL.fsm [-o PLAN] [options]\n"
            "\n"
            "Compiles a model into a static training plan for every rank.\n"
            "\n"
            "  -o PLAN               write the plan file\n"
            "  -D NAME=VALUE         override a dim (repeatable): -D L=4 -D C=128\n"
            "  --emit ir|ir-json     print the graph after all passes to stdout\n"
            "  --emit cuda DIR       write the CUDA program: DIR/kernels.cu (the NVRTC module)\n"
            "                        and DIR/program.txt (each op's launches and GEMMs)\n"
            "  --print-after PASS    print the graph after PASS (lower");
    int n;
    const PassInfo *p = passes_list(&n);
    for (int i = 0; i < n; i++) fprintf(out, ", %s", p[i].name);
    fprintf(out, ")\n"
                 "  --mem[=text|json]     print the per-rank memory plan (no -o needed)\n"
                 "  --mem=html FILE       write it as one self-contained HTML page with a timeline\n"
                 "  --compare PLAN        with --mem=html: overlay another plan's live bytes (a plan\n"
                 "                        file written by fsc -o) on the timeline\n"
                 "  --mem-limit SIZE      fail if a rank's arena exceeds SIZE (80GiB, 512MiB, 1.5TB;\n"
                 "                        B, KiB..TiB, KB..TB) and say which settings would cut it\n"
                 "  --comm                print every collective of a step with its bytes per rank,\n"
                 "                        and what pipeline stages send each other\n"
                 "  --kernels[=text|json] list each launch of the step's CUDA program: op, kernel, blocks x\n"
                 "                        threads, shared memory, FLOPs (on tensor cores or not), DRAM bytes\n"
                 "                        read and written, roofline time on --machine's GPU; then the sums\n"
                 "                        by op kind and the step's roofline, and the GEMMs whose leading\n"
                 "                        dims, batch strides or offsets are not multiples of 16 bytes\n"
                 "  --timeline[=unit]     print the step's schedule: a lane per stage, busy and idle\n"
                 "                        (bubble) time, the makespan; costs are the ops' FLOPs at a\n"
                 "                        nominal 1 TFLOP/s (ms), or with =unit forward 1, backward 2\n"
                 "  --fit SIZE            search the settings for the fastest plan whose device arena\n"
                 "                        fits in SIZE per rank (needs --world W): shard, shard_group,\n"
                 "                        reshard_after_forward, precision, reduce_dtype, offload,\n"
                 "                        recompute (full and selective, per block), stages,\n"
                 "                        microbatches, schedule, balance. Settings given on this command\n"
                 "                        line are pinned; the train block is only the starting point;\n"
                 "                        the batch stays. Prints the Pareto front with reasons and the\n"
                 "                        winner's command line; with -o writes its plan. Candidates are\n"
                 "                        taken by a lower bound on their modelled time and compiled only\n"
                 "                        while it can win (docs/planner.md)\n"
                 "  --machine NAME|FILE   the machine of --fit and --kernels: h100 (the default: H100 SXM, 8 per\n"
                 "                        node), h200 (the same, HBM3e at 4.8 TB/s), or a JSON file (docs/planner.md)\n"
                 "  --gpus-per-node G     ranks per node for --fit (NVLink within, IB across)\n"
                 "  -q, --quiet           no summary on stderr\n"
                 "  -h, --help            this text\n"
                 "  -V, --version         print the version and exit\n"
                 "\n"
                 "Training settings (override the model's `train` section; the default when neither\n"
                 "sets one in brackets):\n");
    const ConfigKey *keys = config_keys(&n);
    TrainConfig def;
    config_default(&def);
    for (int i = 0; i < n; i++) {
        char flag[48], value[64];
        snprintf(flag, sizeof flag, "--%s VALUE", keys[i].key);
        if (config_format(&def, keys[i].key, value, sizeof value)) snprintf(value, sizeof value, "?");
        fprintf(out, "  %-30s %s [%s]\n", flag, keys[i].help, value);
    }
    fprintf(out, "\nThe language: docs/language.md. Examples: samples/*.fsm.\n");
}

static int fail(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "fsc: error: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n(run 'fsc --help' for usage)\n");
    return -1;
}

static int parse_define(Flags *f, const char *text)
{
    const char *eq = strchr(text, '=');
    char *end;
    if (!eq || eq == text) return fail("-D %s: expected NAME=VALUE%s", text, "");
    errno = 0;
    long long v = strtoll(eq + 1, &end, 10);
    if (end == eq + 1 || *end || errno) return fail("-D %s: VALUE must be an integer%s", text, "");
    if (f->n_defines == MAX_FLAGS) return fail("too many -D flags%s%s", "", "");
    char *name = strndup(text, (size_t)(eq - text));
    f->defines[f->n_defines++] = (Define){name, v};
    return 0;
}

/* "shard-group" as the key shard_group: a flag may spell a setting's name with dashes. */
static char *setting_key(const char *key, size_t n)
{
    char *k = strndup(key, n);
    for (char *c = k; c && *c; c++)
        if (*c == '-') *c = '_';
    return k;
}

/* A `--key value` or `--key=value` training setting; config_set validates it later. */
static int parse_setting(Flags *f, const char *arg, const char *next, int *used_next)
{
    const char *key = arg + 2, *eq = strchr(key, '=');
    if (f->n_settings == MAX_FLAGS) return fail("too many settings%s%s", "", "");
    if (eq) {
        f->settings[f->n_settings++] = (Setting){setting_key(key, (size_t)(eq - key)), eq + 1};
        return 0;
    }
    if (!next) return fail("%s needs a value%s", arg, "");
    f->settings[f->n_settings++] = (Setting){setting_key(key, strlen(key)), next};
    *used_next = 1;
    return 0;
}

/* --mem, --mem=text, --mem=json, --mem=html FILE */
static int parse_mem(Flags *f, const char *arg, const char *next, int *used_next)
{
    const char *how = arg[5] == '=' ? arg + 6 : "text";
    if (!strcmp(how, "text") || !strcmp(how, "json")) {
        f->mem = how[0] == 't' ? MEM_OUT_TEXT : MEM_OUT_JSON;
        return 0;
    }
    if (strcmp(how, "html"))
        return fail("--mem: expected --mem, --mem=text, --mem=json or --mem=html FILE, got '%s'%s", arg, "");
    if (!next) return fail("--mem=html needs a file name: --mem=html memory.html%s%s", "", "");
    f->mem = MEM_OUT_HTML, f->mem_html = next, *used_next = 1;
    return 0;
}

static int parse_mem_limit(Flags *f, const char *arg, const char *next, int *used_next)
{
    const char *v = arg[11] == '=' ? arg + 12 : next;
    char err[256];
    if (!v) return fail("--mem-limit needs a size, such as 80GiB%s%s", "", "");
    *used_next = arg[11] != '=';
    if (report_size_parse(v, &f->mem_limit, err, sizeof err)) return fail("--mem-limit: %s%s", err, "");
    f->mem_limit_text = v;
    return 0;
}

/* --fit SIZE, --fit=SIZE */
static int parse_fit(Flags *f, const char *arg, const char *next, int *used_next)
{
    const char *v = arg[5] == '=' ? arg + 6 : next;
    char err[256];
    if (!v) return fail("--fit needs a size per rank, such as 80GiB%s%s", "", "");
    *used_next = arg[5] != '=';
    if (report_size_parse(v, &f->fit, err, sizeof err)) return fail("--fit: %s%s", err, "");
    if (f->fit <= 0) return fail("--fit: the size must be more than 0, got '%s'%s", v, "");
    f->fit_text = v;
    return 0;
}

/* --timeline, --timeline=flops, --timeline=unit */
static int parse_timeline(Flags *f, const char *arg)
{
    const char *how = arg[10] == '=' ? arg + 11 : "flops";
    if (strcmp(how, "flops") && strcmp(how, "unit"))
        return fail("--timeline: expected --timeline or --timeline=unit, got '%s'%s", arg, "");
    f->timeline = 1, f->timeline_cost = how[0] == 'u' ? TL_COST_UNIT : TL_COST_FLOPS;
    return 0;
}

static int parse_args(int argc, char **argv, Flags *f)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
        int used = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "-V") || !strcmp(a, "--version")) {
            printf("fsc %s (plan format %d.%d)\n", FS_VERSION, PLAN_MAJOR, PLAN_MINOR);
            exit(0);
        } else if (!strcmp(a, "-o")) {
            if (!next) return fail("-o needs a file name%s%s", "", "");
            f->output = next, used = 1;
        } else if (!strncmp(a, "-D", 2)) {
            const char *def = a[2] ? a + 2 : next;
            if (!def) return fail("-D needs NAME=VALUE%s%s", "", "");
            if (parse_define(f, def)) return -1;
            used = !a[2];
        } else if (!strcmp(a, "--emit") || !strncmp(a, "--emit=", 7)) {
            const char *what = a[6] == '=' ? a + 7 : next;
            used = a[6] != '=';
            if (what && !strcmp(what, "ir")) {
                f->emit = EMIT_IR;
            } else if (what && !strcmp(what, "ir-json")) {
                f->emit = EMIT_IR_JSON;
            } else if (what && !strcmp(what, "cuda")) {
                const char *dir = i + used + 1 < argc ? argv[i + used + 1] : NULL;
                if (!dir || (dir[0] == '-' && dir[1])) return fail("--emit cuda needs a directory: --emit cuda out/%s%s", "", "");
                f->emit = EMIT_CUDA, f->emit_dir = dir, used++;
            } else {
                return fail("--emit: expected 'ir' or 'ir-json' (or 'cuda DIR'), got '%s'%s", what ? what : "", "");
            }
        } else if (!strcmp(a, "--print-after")) {
            if (!next) return fail("--print-after needs a pass name%s%s", "", "");
            f->print_after = next, used = 1;
        } else if (!strcmp(a, "--comm")) {
            f->comm = 1;
        } else if (!strcmp(a, "--kernels") || !strncmp(a, "--kernels=", 10)) {
            const char *how = a[9] == '=' ? a + 10 : "text";
            if (strcmp(how, "text") && strcmp(how, "json"))
                return fail("--kernels: expected --kernels, --kernels=text or --kernels=json, got '%s'%s", a, "");
            f->kernels = how[0] == 't' ? 1 : 2;
        } else if (!strcmp(a, "--timeline") || !strncmp(a, "--timeline=", 11)) {
            if (parse_timeline(f, a)) return -1;
        } else if (!strcmp(a, "--mem") || !strncmp(a, "--mem=", 6)) {
            if (parse_mem(f, a, next, &used)) return -1;
        } else if (!strcmp(a, "--compare")) {
            if (!next) return fail("--compare needs a plan file: --mem=html page.html --compare other.plan%s%s", "", "");
            f->compare = next, used = 1;
        } else if (!strcmp(a, "--mem-limit") || !strncmp(a, "--mem-limit=", 12)) {
            if (parse_mem_limit(f, a, next, &used)) return -1;
        } else if (!strcmp(a, "--fit") || !strncmp(a, "--fit=", 6)) {
            if (parse_fit(f, a, next, &used)) return -1;
        } else if (!strcmp(a, "--machine") || !strcmp(a, "--gpus-per-node")) {
            if (!next) return fail("%s needs a value%s", a, "");
            char *end;
            long g = a[2] == 'g' ? strtol(next, &end, 10) : 0;
            if (a[2] == 'g' && (end == next || *end || g < 1 || g > 1024))
                return fail("--gpus-per-node: expected an integer from 1 to 1024, got '%s'%s", next, "");
            if (a[2] == 'g') f->gpus_per_node = (int)g;
            else f->machine = next;
            used = 1;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            f->quiet = 1;
        } else if (!strncmp(a, "--", 2) && a[2]) {
            if (parse_setting(f, a, next, &used)) return -1;
        } else if (a[0] == '-' && a[1]) {
            return fail("unknown option '%s'%s", a, "");
        } else if (f->input) {
            return fail("more than one input file ('%s' and '%s')", f->input, a);
        } else {
            f->input = a;
        }
        i += used;
    }
    if (!f->input) return fail("no input file%s%s", "", "");
    return 0;
}

/* Registered first, so it runs last at exit: a failed write to stdout (a full disk) is an
 * error whatever the command printed, --help included. */
static void close_stdout(void)
{
    char err[128];
    if (plan_stdout_close(err, sizeof err)) {
        fprintf(stderr, "fsc: %s\n", err);
        _exit(1);
    }
}

static int check_output(const char *flag, const char *path)
{
    char err[600];
    if (!path || !plan_check_output(path, err, sizeof err)) return 0;
    fprintf(stderr, "fsc: error: %s %s: %s\n", flag, path, err);
    return -1;
}

/* Every file this run writes, checked before it compiles anything; 0, or -1 after saying
 * why. --emit cuda DIR: a writable directory, or one that can be made. */
static int check_outputs(const Flags *f)
{
    if (check_output("-o", f->output) || check_output("--mem=html", f->mem_html)) return -1;
    if (f->compare && f->mem != MEM_OUT_HTML) {
        fprintf(stderr, "fsc: error: --compare %s overlays a plan on the HTML page: give --mem=html FILE too\n",
                f->compare);
        return -1;
    }
    if (!f->emit_dir) return 0;
    struct stat st;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", f->emit_dir);
    for (size_t n = strlen(dir); n > 1 && dir[n - 1] == '/'; n--) dir[n - 1] = 0;
    if (stat(dir, &st)) return check_output("--emit cuda", dir);
    if (S_ISDIR(st.st_mode) && !access(dir, W_OK | X_OK)) return 0;
    fprintf(stderr, "fsc: error: --emit cuda %s: %s\n", f->emit_dir,
            S_ISDIR(st.st_mode) ? strerror(errno) : "exists and is not a directory");
    return -1;
}

/* A plan given where a source goes would be parse errors over binary. The first four
 * bytes of its magic (plan.h's header: "\x89FSP\r\n\x1a\n") are enough: a plan damaged
 * further on (text-mode newlines) is still a plan, and no source starts with 0x89. */
static int is_plan(const char *buf, size_t len)
{
    return len >= 4 && !memcmp(buf, "\x89" "FSP", 4);
}

/* The whole file, NUL-terminated; NULL after printing why (a plan, not a source). */
static char *read_source(const char *path, size_t *len)
{
    char why[256];
    int64_t size;
    int fd = plan_open_input(path, &size, why, sizeof why);  // a regular file, never a wait on a FIFO
    FILE *fp = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!fp || size > MAX_SOURCE) {
        fprintf(stderr, "fsc: error: %s: %s\n", path, fd < 0 ? why : fp ? "too large for a model source (over 16 MiB)"
                                                                      : strerror(errno));
        if (fp) fclose(fp);
        else if (fd >= 0) close(fd);
        return NULL;
    }
    char *buf = malloc((size_t)size + 1);
    *len = buf ? fread(buf, 1, (size_t)size, fp) : 0;
    fclose(fp);
    if (!buf || *len != (size_t)size) {
        fprintf(stderr, "fsc: error: %s: could not read the file\n", path);
        free(buf);
        return NULL;
    }
    buf[*len] = 0;
    if (is_plan(buf, *len)) {
        fprintf(stderr, "fsc: error: %s is a plan compiled by fsc, not a model source; inspect it with fsexec --inspect "
                "%s\n", path, path);
        free(buf);
        return NULL;
    }
    return buf;
}

/* x with a comma every three digits, in buf[32]. */
static const char *commas(int64_t x, char *buf)
{
    char *p = buf + 31;
    *p = 0;
    for (int d = 0; d == 0 || x; d++, x /= 10) {
        if (d && d % 3 == 0) *--p = ',';
        *--p = (char)('0' + x % 10);
    }
    return p;
}

static void summary(const Graph *g, const TrainConfig *t)
{
    int64_t params = ir_param_count(g);
    double flops[PHASE_COUNT] = {0};
    int n_values = 0, n_nodes = 0;
    for (int s = 0; s < (g->n_stage_graphs ? g->n_stage_graphs : 1); s++) {  // every stage's, with stages
        const Graph *sg = g->n_stage_graphs ? g->stage_graphs[s] : g;
        for (int i = 0; i < sg->n_nodes; i++) {  // what a node redoes of the forward is recompute
            const Node *nd = &sg->nodes[i];
            double all = ir_op_hooks(nd->op)->flops(sg, nd), redone = ir_node_redone_flops(sg, nd);
            flops[nd->phase] += all - redone;
            flops[PHASE_RECOMPUTE] += redone;
        }
        n_values += sg->n_values, n_nodes += sg->n_nodes;
    }
    char num[32], frozen[64] = "";
    if (ir_frozen_count(g)) snprintf(frozen, sizeof frozen, ", %s frozen", commas(ir_frozen_count(g), num));
    fprintf(stderr, "%s: %s params%s (%.1f MiB in f32), %d blocks, %d values, %d nodes\n", g->model,
            commas(params, num), frozen, (double)params * 4 / (1 << 20), g->n_blocks, n_values, n_nodes);
    fprintf(stderr, "GFLOP per step and %s: forward %.2f, backward %.2f, recompute %.2f, optimizer %.2f\n",
            g->n_stage_graphs ? "data-parallel rank (all stages)" : "rank",
            flops[PHASE_FORWARD] / 1e9, flops[PHASE_BACKWARD] / 1e9, flops[PHASE_RECOMPUTE] / 1e9,
            flops[PHASE_OPTIMIZER] / 1e9);
    char group[64] = "";  // hybrid sharding: "fsdp in groups of 4"
    if (t->shard_group > 0) snprintf(group, sizeof group, " in groups of %d", t->shard_group);
    fprintf(stderr, "train: %s, lr %g, precision %s, shard %s%s, world %d, recompute %s\n",
            optim_name(t->optimizer), t->lr, precision_name(t->precision), shard_name(t->shard), group, t->world,
            t->recompute);
    if (!g->n_stage_graphs) return;
    fprintf(stderr, "pipeline: %d stages x %d data-parallel ranks, %d micro-batches, schedule %s, checkpoint %s, "
            "blocks per stage", g->n_stage_graphs, t->world / g->n_stage_graphs, t->microbatches,
            sched_name(t->schedule), checkpoint_name(t->checkpoint));
    for (int s = 0; s < g->n_stage_graphs; s++) {  // the blocks a stage's params belong to
        const Graph *sg = g->stage_graphs[s];
        int n = 0, last = -1;
        for (int v = 0; v < sg->n_values; v++)
            if (sg->values[v].role == ROLE_PARAM && sg->values[v].block > last) last = sg->values[v].block, n++;
        fprintf(stderr, "%s%d", s ? "," : " ", n);
    }
    fprintf(stderr, " (balance %s)\n", t->balance);
}

/* ---- the forward-only programs --------------------------------------------------------- */

/* The programs fsc plans beside the training step: the evaluation program (the forward
 * and the loss of the global batch, over the training's ranks and strategy), the
 * sampling program (one sequence, one rank) and, from the sampling program's lowered
 * graph, the decode program (one token at a position, with KV caches: passes_decode).
 * Each is the source lowered again, with settings over the user's, through the forward
 * passes (passes_run_forward). */
typedef struct {
    Graph *eval, *sample;   // NULL: none (interleaved chunks have no eval program; only a language model samples)
    Graph *decode;          // NULL: none (a model that cannot decode: fsc's note says why)
    TrainConfig eval_t, sample_t;
} Forward;

enum { MAX_FORWARD_SETTINGS = MAX_FLAGS + 8 };

/* The logits a language model's loss reads, cross_entropy(logits [B, T, V], targets)
 * (after shard: through the mean over the ranks), or -1 for another model. */
static int lm_logits(const Graph *g)
{
    int loss = g->n_outputs ? g->outputs[0] : -1;
    const Node *n = loss >= 0 && g->values[loss].producer >= 0 ? &g->nodes[g->values[loss].producer] : NULL;
    if (n && n->op == OP_all_reduce && n->n_in == 1) {
        int in = ir_in(g, n, 0);
        n = g->values[in].producer >= 0 ? &g->nodes[g->values[in].producer] : NULL;
    }
    return n && n->op == OP_cross_entropy && g->values[ir_in(g, n, 0)].rank == 3 ? ir_in(g, n, 0) : -1;
}

/* The decode program of the lowered sampling graph g (logits: its logits), through the
 * forward passes, into *dg; or none, with a note saying why. -1 after errors. */
static int decode_graph(const Graph *g, int logits, const Options *o, Diag *d, Graph **dg)
{
    char why[600];
    if (passes_decode(g, logits, dg, why, sizeof why)) {
        fprintf(stderr, "fsc: note: no decode program (no KV cache): fsexec --sample reruns the forward of the last T "
                "tokens for each token; the model cannot decode one token at a time: %s\n", why);
        return 0;
    }
    if (!passes_run_forward(*dg, o, d)) return 0;
    ir_graph_free(*dg);
    *dg = NULL;
    return -1;
}

/* The model lowered with `extra` settings after the command line's, and its forward
 * passes run with one micro-batch; NULL after printing the errors (naming `what`).
 * Warnings were the training compile's, so they are not repeated. With `decode`, the
 * logits are kept as an output and *decode is the decode program (or NULL). */
static Graph *forward_graph(const char *src, size_t len, const char *path, const FrontendOptions *fo,
                            const Setting *extra, int n_extra, Graph **decode, TrainConfig *t, const char *what)
{
    Setting sets[MAX_FORWARD_SETTINGS];
    int ns = 0;
    for (int i = 0; i < fo->n_settings; i++) sets[ns++] = fo->settings[i];
    for (int i = 0; i < n_extra; i++) sets[ns++] = extra[i];
    char *text = NULL;
    size_t text_len = 0;
    FILE *msgs = open_memstream(&text, &text_len);
    if (!msgs) return NULL;
    Diag d;
    diag_init(&d, path, src, len, msgs);
    FrontendOptions o2 = {fo->defines, fo->n_defines, sets, ns};
    Options o = {.verify = 1};
    Graph *g = fe_compile(src, len, &o2, &o.train, &d);
    o.train.microbatches = 1;  // the batch was split at lowering; the graph is one micro-batch
    int logits = g && decode ? lm_logits(g) : -1, kept = 0;
    for (int i = 0; g && i < g->n_outputs; i++) kept |= g->outputs[i] == logits;
    if (logits >= 0 && !kept) ir_output_add(g, logits);  // the sampler reads them after the run
    if (g && logits >= 0) passes_eval_identity(g);       // the decode program's too
    if (g && logits >= 0 && decode_graph(g, logits, &o, &d, decode)) {
        ir_graph_free(g);
        g = NULL;
        what = "the decode program";
    }
    if (g && passes_run_forward(g, &o, &d)) {
        ir_graph_free(g);
        g = NULL;
    }
    fclose(msgs);
    if (!g) fprintf(stderr, "fsc: error: %s:\n%s", what, text ? text : "");
    free(text);
    *t = o.train;
    return g;
}

/* The training's cut into stages as a balance ("3,3,2": blocks per stage), in buf; 0, or
 * -1 when it is not one run of blocks per stage (interleaved model chunks). */
static int stage_balance(const Graph *train, char *buf, size_t len)
{
    size_t at = 0;
    int next = 0;
    for (int s = 0; s < train->n_stage_graphs; s++) {
        const Graph *sg = train->stage_graphs[s];
        int lo = INT32_MAX, hi = -1;
        for (int n = 0; n < sg->n_nodes; n++)
            if (sg->nodes[n].block >= 0) {
                if (sg->nodes[n].block < lo) lo = sg->nodes[n].block;
                if (sg->nodes[n].block > hi) hi = sg->nodes[n].block;
            }
        if (hi < 0 || lo != next || sg->n_chunks > 1) return -1;
        next = hi + 1;
        at += (size_t)snprintf(buf + at, at < len ? len - at : 0, "%s%d", s ? "," : "", hi - lo + 1);
    }
    return at < len ? 0 : -1;
}

/* The sampling program of a language model (and its decode program): one sequence on one
 * rank, whatever the training's strategy and stages (it runs in one process), its batch
 * dim of B rows split into B parts at lowering (as micro-batches would be). B: the rows
 * of the eval program's input on a rank, times the data-parallel ranks. 0, or -1 after
 * errors. */
static int sample_program(const char *src, size_t len, const char *path, const FrontendOptions *fo, int64_t B,
                          Forward *fw)
{
    char batch[32];
    snprintf(batch, sizeof batch, "%lld", (long long)B);
    const Setting sample[] = {{"world", "1"}, {"shard", "none"}, {"microbatches", batch}, {"recompute", "none"},
                              {"offload", "none"}, {"shard_group", "0"}, {"precision", "fp32"}, {"stages", "1"}};
    /* fp32 whatever the training computes in: the sampler reads f32 logits, the weights it
     * loads are the fp32 masters (a 16-bit plan's checkpoint and --save-weights hold them),
     * and one token at a time is not where 16-bit compute pays. */
    fw->sample = forward_graph(src, len, path, fo, sample, 8, &fw->decode, &fw->sample_t, "the sampling program");
    return fw->sample ? 0 : -1;
}

/* The rows of g's first data input with a batch dim (one rank's, one micro-batch's). */
static int64_t input_rows(const Graph *g)
{
    for (int i = 0; i < g->n_values; i++)
        if (g->values[i].role == ROLE_INPUT && g->values[i].rank > 0) return g->values[i].shape[0];
    return 0;
}

/* The eval program (with pipeline stages: cut as the training's, its one micro-batch in
 * turn through them; none for interleaved model chunks) and, for a language model, the
 * sampling program (sample_program). 0, or -1 after errors. */
static int forward_programs(const Graph *train, const char *src, size_t len, const char *path,
                            const FrontendOptions *fo, Forward *fw)
{
    *fw = (Forward){0};
    if (fo->n_settings + 8 > MAX_FORWARD_SETTINGS) return 0;
    char balance[256];
    if (train->n_stage_graphs) {
        /* The eval program's logits are the last stage's; whether the model is a language
         * model, and its batch, come from a stage-less lowering of one micro-batch. */
        const Setting whole[] = {{"world", "1"}, {"stages", "1"}, {"shard", "none"}, {"shard_group", "0"},
                                 {"microbatches", "1"}, {"recompute", "none"}, {"offload", "none"}};
        TrainConfig t;
        Graph *one = forward_graph(src, len, path, fo, whole, 7, NULL, &t, "the sampling program");
        if (!one) return -1;
        int64_t B = lm_logits(one) >= 0 ? input_rows(one) : 0;
        ir_graph_free(one);
        if (B && sample_program(src, len, path, fo, B, fw)) return -1;
        if (stage_balance(train, balance, sizeof balance)) return 0;
        const Setting eval[] = {{"microbatches", "1"}, {"recompute", "none"}, {"offload", "none"},
                                {"schedule", "gpipe"}, {"checkpoint", "never"}, {"balance", balance}};
        fw->eval = forward_graph(src, len, path, fo, eval, 6, NULL, &fw->eval_t, "the evaluation program");
        return fw->eval ? 0 : -1;
    }
    const Setting eval[] = {{"microbatches", "1"}, {"recompute", "none"}, {"offload", "none"}};
    fw->eval = forward_graph(src, len, path, fo, eval, 3, NULL, &fw->eval_t, "the evaluation program");
    if (!fw->eval) return -1;
    if (lm_logits(fw->eval) < 0) return 0;
    return sample_program(src, len, path, fo, input_rows(fw->eval) * fw->eval_t.world, fw);
}

static void forward_free(Forward *fw)
{
    ir_graph_free(fw->eval);
    ir_graph_free(fw->sample);
    ir_graph_free(fw->decode);
}

/* The plan of one forward-only program, as p's sub-plan; 0, or -1 with a message. */
static int attach(Plan **sub, const Graph *g, const TrainConfig *t, const char *what, char *err, size_t errlen)
{
    char why[512];
    if (!g) return 0;
    if (!(*sub = codegen_plan(g, t, why, sizeof why))) {
        snprintf(err, errlen, "%s: %s", what, why);
        return -1;
    }
    return 0;
}

/* The plan of g (with the forward-only programs of fw, when given), or NULL after saying why. */
static Plan *make_plan(const Graph *g, const TrainConfig *t, const char *source, const Forward *fw)
{
    char err[600];
    Plan *plan = codegen_plan(g, t, err, sizeof err);
    if (plan && fw && (attach(&plan->eval, fw->eval, &fw->eval_t, "the evaluation program", err, sizeof err) ||
                       attach(&plan->sample, fw->sample, &fw->sample_t, "the sampling program", err, sizeof err) ||
                       attach(&plan->decode, fw->decode, &fw->sample_t, "the decode program", err, sizeof err))) {
        plan_free(plan);
        plan = NULL;
    }
    if (plan && source && fsc_set_source(plan, source)) {
        plan_free(plan);
        plan = NULL;
        snprintf(err, sizeof err, "out of memory building the plan");
    }
    if (!plan) fprintf(stderr, "fsc: error: %s\n", err);
    return plan;
}

static int write_plan(const Graph *g, const TrainConfig *t, const Forward *fw, const char *source, const char *path,
                      int quiet)
{
    char err[512];
    Plan *plan = make_plan(g, t, source, fw);
    if (!plan) return -1;
    int rc = plan_write(plan, path, err, sizeof err);
    if (rc)
        fprintf(stderr, "fsc: error: %s: %s\n", path, err);
    else if (!quiet)
        fprintf(stderr, "wrote %s\n", path);
    plan_free(plan);
    return rc;
}

/* DIR/NAME from text (writer(plan, file) when text is NULL); 0, or -1 after saying why. */
static int write_file(const char *dir, const char *name, const char *text, const Plan *plan)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "w");
    if (!fp) {
        fprintf(stderr, "fsc: error: %s: %s\n", path, strerror(errno));
        return -1;
    }
    int bad = text ? fputs(text, fp) < 0 : codegen_cuda_print(plan, fp) != 0;
    if (fclose(fp) || bad) {
        fprintf(stderr, "fsc: error: %s: could not write the file\n", path);
        return -1;
    }
    return 0;
}

/* --emit cuda DIR: the module and the program, as the plan carries them. */
static int emit_cuda(const Graph *g, const TrainConfig *t, const char *dir, int quiet)
{
    struct stat st;
    if (mkdir(dir, 0777) && (errno != EEXIST || stat(dir, &st) || !S_ISDIR(st.st_mode))) {
        fprintf(stderr, "fsc: error: --emit cuda %s: %s\n", dir, errno == EEXIST ? "exists and is not a directory" : strerror(errno));
        return 1;
    }
    Plan *plan = make_plan(g, t, NULL, NULL);
    if (!plan) return 1;
    const char *src = codegen_cuda_source(plan);
    int rc = 1;
    if (!src)
        fprintf(stderr, "fsc: error: --emit cuda: the plan has no CUDA program\n");
    else if (!write_file(dir, "kernels.cu", src, plan) && !write_file(dir, "program.txt", NULL, plan))
        rc = 0;
    if (!rc && !quiet) fprintf(stderr, "wrote %s/kernels.cu and %s/program.txt (%d instructions)\n", dir, dir, plan->n_cuda);
    plan_free(plan);
    return rc;
}

/* --mem and --mem-limit: the report of the plan built in memory (not written). */
static int memory(const Graph *g, const TrainConfig *t, const Forward *fw, const Flags *f, const char *src,
                  size_t len, const FrontendOptions *fo)
{
    Plan *plan = make_plan(g, t, f->input, fw);
    if (!plan) return 1;
    FscMem m = {.out = f->mem, .html_path = f->mem_html, .compare = f->compare, .limit = f->mem_limit,
                .limit_text = f->mem_limit_text,
                .src = src, .len = len, .path = f->input, .fo = fo, .quiet = f->quiet};
    int rc = fsc_mem(plan, &m);
    plan_free(plan);
    return rc;
}

/* --comm: every collective of a step with its bytes, from the plan built in memory. */
static int communication(const Graph *g, const TrainConfig *t)
{
    Plan *plan = make_plan(g, t, NULL, NULL);
    if (!plan) return 1;
    comm_report(plan, stdout);
    plan_free(plan);
    return 0;
}

/* --timeline: the step's schedule on a logical clock, from the plan built in memory. */
static int timeline(const Graph *g, const TrainConfig *t, TlCost cost)
{
    char err[512];
    Plan *plan = make_plan(g, t, NULL, NULL);
    if (!plan) return 1;
    Timeline *tl = report_timeline_new(plan, cost, err, sizeof err);
    if (tl)
        report_timeline_print(tl, stdout);
    else
        fprintf(stderr, "fsc: error: --timeline: %s\n", err);
    report_timeline_free(tl);
    plan_free(plan);
    return !tl;
}

/* --kernels: what each launch should cost on --machine's GPU, from the plan built in memory. */
static int kernels(const Graph *g, const TrainConfig *t, const Flags *f)
{
    char err[2048];
    Machine m;
    if (machine_select(&m, f->machine, err, sizeof err)) {
        fprintf(stderr, "fsc: error: %s\n", err);
        return 1;
    }
    KernGpu gpu = {.flops_16bit = m.flops_16bit, .flops_tf32 = m.flops_tf32, .flops_fp32 = m.flops_fp32,
                   .hbm_bw = m.hbm_bw};
    snprintf(gpu.name, sizeof gpu.name, "%s", m.name);
    Plan *plan = make_plan(g, t, f->input, NULL);  // the source names where a misaligned GEMM comes from
    if (!plan) return 1;
    int rc = f->kernels == 2 ? report_kernels_json(plan, &gpu, stdout, err, sizeof err)
                             : report_kernels_print(plan, &gpu, stdout, err, sizeof err);
    if (rc) fprintf(stderr, "fsc: error: --kernels: %s\n", err);
    plan_free(plan);
    return rc != 0;
}

/* "fsc ARGS" less --fit, --machine, --gpus-per-node (with their values), -o and -q: the
 * start of the winner's command line. */
static void fit_command(int argc, char **argv, char *buf, size_t n)
{
    snprintf(buf, n, "fsc");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--fit") || !strcmp(a, "--machine") || !strcmp(a, "--gpus-per-node") || !strcmp(a, "-o")) {
            i++;
            continue;
        }
        if (!strncmp(a, "--fit=", 6) || !strcmp(a, "-q") || !strcmp(a, "--quiet")) continue;
        int plain = *a != 0;
        for (const char *c = a; *c; c++) plain &= isalnum((unsigned char)*c) || strchr("_./=,:+-%@", *c);
        snprintf(buf + strlen(buf), n - strlen(buf), plain ? " %s" : " '%s'", a);
    }
}

/* --fit: the search, its report on stdout; then the winner's settings join the command
 * line's, so that what follows compiles (and with -o writes) the plan of the command line
 * it printed. 0, or -1 after saying why (nothing fits: the smallest found). */
static int fit(Flags *f, int argc, char **argv, const char *src, size_t len, FitResult *r)
{
    FrontendOptions fo = {f->defines, f->n_defines, f->settings, f->n_settings};
    FitRequest q = {.src = src, .len = len, .path = f->input, .fo = &fo, .budget = f->fit, .output = f->output};
    const char *world = NULL;
    for (int i = 0; i < f->n_settings; i++)
        if (!strcmp(f->settings[i].key, "world")) world = f->settings[i].value;
    char *end, err[2048], cmd[8192];
    long w = world ? strtol(world, &end, 10) : 0;
    if (!world || end == world || *end || w < 1 || w > 1 << 20) {
        fprintf(stderr, "fsc: error: --fit needs --world W, the number of ranks (1 to 1048576)%s%s\n",
                world ? ", got " : "", world ? world : "");
        return -1;
    }
    q.world = (int)w;
    if (machine_select(&q.machine, f->machine, err, sizeof err)) {
        fprintf(stderr, "fsc: error: %s\n", err);
        return -1;
    }
    if (f->gpus_per_node) q.machine.gpus_per_node = f->gpus_per_node;
    fit_command(argc, argv, cmd, sizeof cmd);
    q.command = cmd;
#ifdef __GLIBC__
    /* The search compiles hundreds of plans on two threads, each allocating and freeing
     * graphs of hundreds of MiB: glibc would map and unmap them each time, and the page
     * faults of the two threads serialize on the process's memory map (a fifth of the
     * search's time). Kept on the heap, they are reused. */
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
    if (planner_fit(&q, r, err, sizeof err)) {
        fprintf(stderr, "fsc: error: --fit: %s\n", err);
        return -1;
    }
    planner_report(&q, r, stdout);
    if (r->winner < 0) {
        fprintf(stderr, "fsc: error: --fit %s: no candidate fits in it (the smallest arena found is above)\n",
                f->fit_text);
        return -1;
    }
    Setting sets[AX_COUNT + 1];
    int n = space_settings(&r->space, &r->points[r->winner].cand, sets);
    if (f->n_settings + n > MAX_FLAGS) return fail("too many settings%s%s", "", "");
    for (int i = 0; i < n; i++) f->settings[f->n_settings++] = (Setting){strdup(sets[i].key), sets[i].value};
    return 0;
}

/* The names parse_define and setting_key copied. */
static int flags_free(Flags *f, int rc)
{
    for (int i = 0; i < f->n_defines; i++) free((char *)f->defines[i].name);
    for (int i = 0; i < f->n_settings; i++) free((char *)f->settings[i].key);
    return rc;
}

int main(int argc, char **argv)
{
    plan_stdout_open();
    atexit(close_stdout);
    Flags f = {0};
    if (parse_args(argc, argv, &f) || check_outputs(&f)) return flags_free(&f, 1);
    if (!f.fit && f.gpus_per_node) {
        fprintf(stderr, "fsc: error: --gpus-per-node describes the machine of --fit: give --fit SIZE too\n");
        return flags_free(&f, 1);
    }
    if (!f.fit && !f.kernels && f.machine) {
        fprintf(stderr, "fsc: error: --machine describes the machine of --fit and --kernels: give one of them too\n");
        return flags_free(&f, 1);
    }
    size_t len;
    char *src = read_source(f.input, &len);
    if (!src) return flags_free(&f, 1);
    FitResult fr = {0};
    if (f.fit && fit(&f, argc, argv, src, len, &fr)) {
        planner_free(&fr);
        free(src);
        return flags_free(&f, 1);
    }

    Diag d;
    diag_init(&d, f.input, src, len, stderr);
    FrontendOptions fo = {f.defines, f.n_defines, f.settings, f.n_settings};
    Options o = {.print_after = f.print_after, .print_out = stdout, .verify = 1,
                 .print_json = f.emit == EMIT_IR_JSON};
    Graph *g = fe_compile(src, len, &fo, &o.train, &d);
    int rc = !g || passes_run(g, &o, &d) != 0;
    Forward fw = {0};
    if (!rc && (f.output || f.mem || f.mem_limit)) rc = forward_programs(g, src, len, f.input, &fo, &fw) != 0;
    if (!rc && f.emit == EMIT_IR) ir_print(g, stdout);
    if (!rc && f.emit == EMIT_IR_JSON) rc = ir_print_json(g, stdout) != 0;
    if (!rc && f.emit == EMIT_CUDA) rc = emit_cuda(g, &o.train, f.emit_dir, f.quiet);
    if (!rc && !f.quiet) summary(g, &o.train);
    if (!rc && (f.mem || f.mem_limit)) rc = memory(g, &o.train, &fw, &f, src, len, &fo);
    if (!rc && f.comm) rc = communication(g, &o.train);
    if (!rc && f.kernels) rc = kernels(g, &o.train, &f);
    if (!rc && f.timeline) rc = timeline(g, &o.train, f.timeline_cost);
    if (!rc && f.output) rc = write_plan(g, &o.train, &fw, f.input, f.output, f.quiet) != 0;
    if (d.n_errors) fprintf(stderr, "%d error%s\n", d.n_errors, d.n_errors == 1 ? "" : "s");

    forward_free(&fw);
    ir_graph_free(g);
    planner_free(&fr);
    free(src);
    return flags_free(&f, rc);
}
