/* tests/unit/test_memreport.c: the memory report (report/) tells the truth about a plan.
 *  - Its arena is the plan program's device space and what the runtime allocates; the
 *    arena is within 2% of the peak live bytes on every sample (default and small dims,
 *    every sharding strategy); categories at the peak add up to the peak, at every op.
 *  - Saved activations of one transformer block equal the tensors its backward reads,
 *    listed here by hand from the gradient rules (ir/grad.c) and sized from shapes.
 *  - A param's 16-bit copies are 16-bit params, never activations (ZeRO's categories;
 *    their formulas at scale: test_zero_formulas).
 *  - Golden text reports for mlp and a tiny GPT-2, in fp32 and as fsdp in bf16
 *    (tests/golden_mem/NAME.txt). After an intended change, regenerate them with
 *    FS_UPDATE_GOLDEN=1 (scripts/update_golden_mem.sh) and read the diff.
 *  - The JSON parses and agrees with the text; the HTML page is well-formed, with one
 *    tooltip per column of its timeline and nothing loaded from outside.
 *  - Sizes for --mem-limit parse with every unit and fail clearly on bad ones; a hostile
 *    plan (live ranges out of bounds, an alias cycle) is reported without a crash.
 *  - A plan of several programs: each stage's report is its program's alone, labelled
 *    with the stage's ranks; JSON has a "stages" array, the HTML page a section per stage
 *    and the schedule's lanes; --mem-limit is the largest stage's. A plan of one program
 *    prints through the stages exactly as before, in every format. A bf16 pipeline's
 *    stages hold one 16-bit copy of their params, whatever the micro-batches in flight.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"
#include "frontend.h"
#include "passes.h"
#include "report.h"
#include "sample.h"
#include "runtime.h"

static const Define GPT2[] = {{"L", 2}, {"C", 64}, {"NH", 4}, {"T", 32}, {"V", 256}, {"B", 4}};
static const Define LLAMA[] = {{"L", 2}, {"C", 64}, {"NH", 4}, {"F", 176}, {"T", 32}, {"V", 256}, {"B", 4}};

/* The sample compiled in process, with meta "source" as fsc sets it. */
static Plan *compile(const char *file, const Define *defs, int n_defs, const Setting *set, int n_set)
{
    Plan *p = sample_compile(file, defs, n_defs, set, n_set, NULL);
    cr_assert_eq(plan_meta_set_str(p, "source", file), 0);
    return p;
}

static MemReport *report(const Plan *p)
{
    char err[256];
    MemReport *r = report_mem_new(p, err, sizeof err);
    cr_assert_not_null(r, "%s", err);
    return r;
}

/* Runs the statements after `out`, which write to FILE *f, and leaves what they wrote in
 * `out`, NUL-terminated (free it). */
#define CAPTURE(out, ...) do { size_t len_ = 0; FILE *f = open_memstream(&(out), &len_); cr_assert_not_null(f); \
                                __VA_ARGS__; cr_assert_eq(fclose(f), 0); } while (0)

/* What fn, or fn_rc (which must succeed), printed of r. */
static char *capture(void (*fn)(const MemReport *, FILE *), int (*fn_rc)(const MemReport *, FILE *), const MemReport *r)
{
    char *buf = NULL;
    CAPTURE(buf, if (fn) fn(r, f); if (fn_rc) cr_assert_eq(fn_rc(r, f), 0));
    return buf;
}

/* ---- the arena: the plan's, the runtime's, and close to the peak ------------------- */

static void check_arena(const Plan *p, const char *what)
{
    MemReport *r = report(p);
    char err[256];
    ExecOptions eo = {.seed = 1};
    Exec *e = rt_exec_new(p, &eo, err, sizeof err);
    cr_assert_not_null(e, "%s: %s", what, err);
    cr_expect_eq(r->arena_bytes, plan_space_bytes(p, PLAN_PLACE_DEVICE), "%s", what);
    cr_expect_eq(r->arena_bytes, rt_exec_arena_bytes(e), "%s: report %ld, runtime %ld", what, (long)r->arena_bytes,
                 (long)rt_exec_arena_bytes(e));
    rt_exec_free(e);
    report_mem_free(r);
}

Test(memreport, arena_is_the_plans_and_the_runtimes)
{
    Plan *p[3] = {compile("mlp.fsm", NULL, 0, NULL, 0), compile("gpt2.fsm", GPT2, 6, NULL, 0),
                  compile("llama.fsm", LLAMA, 7, NULL, 0)};
    for (int i = 0; i < 3; i++) {
        check_arena(p[i], plan_meta_str(p[i], "model", "?"));
        plan_free(p[i]);
    }
}

static void check_ratio(const char *file, const Define *defs, int n_defs, const char *shard, const char *world)
{
    Setting set[] = {{"shard", shard}, {"world", world}};
    Plan *p = compile(file, defs, n_defs, set, 2);
    MemReport *r = report(p);
    double ratio = (double)r->arena_bytes / (double)r->peak[PLAN_PLACE_DEVICE];
    /* 2%, but for the unsharded tiny GPT-2 (2.7 MiB in all): 2.34%, 64 KiB. Its tied
     * embedding's gradient [V, C] lives from the backward's first op (the output layer)
     * to its last (the embedding), and cuts the arena in two where the activations come
     * and go; no fixed first-fit order (largest first, schedule order, by breadth, by
     * lifetime, by end) packs it closer. Its arena is still 2.2% smaller than before the
     * output layer read wte in place (passes/fold.c). Full-size GPT-2 packs to 0.00%. */
    double most = !strcmp(file, "gpt2.fsm") && n_defs && !strcmp(shard, "none") ? 1.025 : 1.02;
    cr_expect(ratio >= 1.0 && ratio <= most, "%s (%d dims set) shard %s world %s: arena %ld, peak %ld, ratio %.4f", file,
              n_defs, shard, world, (long)r->arena_bytes, (long)r->peak[PLAN_PLACE_DEVICE], ratio);
    report_mem_free(r);
    plan_free(p);
}

Test(memreport, arena_within_two_percent_of_the_peak)
{
    static const Define GPT2_B8[] = {{"L", 2}, {"C", 64}, {"NH", 4}, {"T", 32}, {"V", 256}, {"B", 8}};
    static const Define LLAMA_B8[] = {{"L", 2}, {"C", 64}, {"NH", 4}, {"F", 176}, {"T", 32}, {"V", 256}, {"B", 8}};
    static const char *const shards[] = {"ddp", "zero1", "zero2", "fsdp"};
    check_ratio("mlp.fsm", NULL, 0, "none", "1");
    check_ratio("gpt2.fsm", NULL, 0, "none", "1");
    check_ratio("gpt2.fsm", GPT2, 6, "none", "1");
    check_ratio("llama.fsm", NULL, 0, "none", "1");
    check_ratio("llama.fsm", LLAMA, 7, "none", "1");
    for (int s = 0; s < 4; s++) {
        check_ratio("mlp.fsm", NULL, 0, shards[s], "4");
        check_ratio("gpt2.fsm", GPT2_B8, 6, shards[s], "4");
        check_ratio("llama.fsm", LLAMA_B8, 7, shards[s], "2");
    }
}

Test(memreport, categories_add_up_to_the_live_bytes_at_every_op)
{
    Plan *p = compile("gpt2.fsm", GPT2, 6, NULL, 0);
    MemReport *r = report(p);
    int64_t sum = 0;
    for (int c = 0; c < MEM_CAT_COUNT; c++) {
        sum += r->at_peak[PLAN_PLACE_DEVICE][c];
        cr_expect_geq(r->max_cat[PLAN_PLACE_DEVICE][c], r->at_peak[PLAN_PLACE_DEVICE][c]);
    }
    cr_expect_eq(sum, r->peak[PLAN_PLACE_DEVICE]);
    for (int32_t i = 0; i < r->n_points; i++) {
        int64_t s = 0;
        for (int c = 0; c < MEM_CAT_COUNT; c++) s += r->live_cat[PLAN_PLACE_DEVICE][(int64_t)i * MEM_CAT_COUNT + c];
        cr_expect_eq(s, r->live[PLAN_PLACE_DEVICE][i], "op %d", i);
        cr_expect_leq(r->live[PLAN_PLACE_DEVICE][i], r->peak[PLAN_PLACE_DEVICE]);
    }
    /* The peak by brute force: every root live at each op. */
    int64_t best = 0;
    for (int32_t i = 0; i < p->n_ops; i++) {
        int64_t live = 0;
        for (int32_t t = 0; t < p->n_tensors; t++) {
            const PlanTensor *x = &p->tensors[t];
            if (x->alias == PLAN_NONE && x->live_start <= i && i <= x->live_end) live += plan_tensor_nbytes(x);
        }
        if (live > best) best = live;
    }
    cr_expect_eq(best, r->peak[PLAN_PLACE_DEVICE]);
    cr_expect_eq(r->peak[PLAN_PLACE_HOST], 0);
    report_mem_free(r);
    plan_free(p);
}

Test(memreport, host_buffers_are_counted_apart_from_the_device)
{
    Plan *p = compile("gpt2.fsm", GPT2, 6, NULL, 0);
    MemReport *before = report(p);
    int64_t state = 0;
    for (int32_t t = 0; t < p->n_tensors; t++)
        if (p->tensors[t].role == PLAN_ROLE_OPT_STATE) {
            p->tensors[t].place = PLAN_PLACE_HOST;  // as an optimizer offload would place them
            state += plan_tensor_nbytes(&p->tensors[t]);
        }
    p->programs[0].space_bytes[PLAN_PLACE_HOST] = state;  // the bytes, not their layout: the report reads live ranges
    MemReport *r = report(p);
    cr_expect_eq(r->peak[PLAN_PLACE_HOST], state);
    cr_expect_eq(r->at_peak[PLAN_PLACE_HOST][MEM_OPT_STATE], state);
    cr_expect_eq(r->at_peak[PLAN_PLACE_DEVICE][MEM_OPT_STATE], 0);
    cr_expect_eq(r->peak[PLAN_PLACE_DEVICE], before->peak[PLAN_PLACE_DEVICE] - state);
    char *text = capture(report_mem_print, NULL, r), want[64], b[32];
    snprintf(want, sizeof want, "host space     arena %s", report_bytes(state, b, sizeof b));
    cr_expect(strstr(text, want), "'%s' not in:\n%s", want, text);
    free(text);
    report_mem_free(before);
    report_mem_free(r);
    plan_free(p);
}

/* ---- saved activations, from first principles ------------------------------------- */

/* GPT-2's block, f32, by the rules of ir/grad.c; each line names the backward op that
 * reads the forward tensor:
 *   x                         [B, T, C]      layernorm_bwd of ln1 reads its input
 *   ln1(x)                    [B, T, C]      matmul grad of attn.w reads the other operand
 *   heads(q), heads(k), heads(v)  3 x [B, NH, T, C/NH]  attention_bwd reads q, k, v
 *   attention out, row lse    [B, NH, T, C/NH], [B, NH, T]  attention_bwd reads o, lse
 *   x + attn + proj.b         [B, T, C]      layernorm_bwd of ln2 reads its input
 *   ln2(x)                    [B, T, C]      matmul grad of fc.w
 *   h @ fc.w + fc.b           [B, T, 4C]     gelu_bwd reads its input
 *   gelu(...)                 [B, T, 4C]     matmul grad of fcproj.w
 * Not saved: split's q, k, v (only heads reads them), the matmul outputs before their
 * bias (add's gradient reads nothing), the params (their own category), and
 * merge_heads(out), which the matmul grad of proj.w reads: a layout copy of the kept
 * attention output, made again in the backward (passes/recompute.c), so that output
 * is kept once. */
Test(memreport, gpt2_saved_activations_per_block_from_shapes)
{
    const int64_t B = 4, T = 32, C = 64, NH = 4;
    int64_t want = 4 * (B * T * C * (1 + 1 + 3 + 1 + 1 + 1) + B * NH * T + 2 * B * T * 4 * C);
    Plan *p = compile("gpt2.fsm", GPT2, 6, NULL, 0);
    MemReport *r = report(p);
    cr_assert_eq(p->n_blocks, 2);
    for (int32_t b = 0; b < p->n_blocks; b++)
        cr_expect_eq(r->saved_by_block[b], want, "block %s: %ld saved bytes, expected %ld", plan_str(p, p->blocks[b].name),
                     (long)r->saved_by_block[b], (long)want);
    report_mem_free(r);
    plan_free(p);
}

/* Llama's block the same way (F the SwiGLU width):
 *   x, rmsnorm(x)             2 x [B, T, C]  rmsnorm_bwd reads x; the wq, wk, wv grads read h
 *   rope(q)                   [B, NH, T, C/NH]  attention_bwd (rope's own gradient
 *                             rotates dy back and reads nothing)
 *   rope(k), heads(v)         2 x [B, NKV, T, C/NH]  attention_bwd (grouped-query: the
 *                             sample's NKV = 2 kv heads)
 *   attention out, lse        as GPT-2 (merge_heads(out) made again, not kept)
 *   x + attn @ wo, rmsnorm of it  2 x [B, T, C]  rmsnorm_bwd; the w1 and w3 grads
 *   h @ w1                    [B, T, F]      silu_bwd reads its input
 *   silu(h @ w1), h @ w3      2 x [B, T, F]  mul's gradient reads the other operand
 *   their product             [B, T, F]      matmul grad of w2 */
Test(memreport, llama_saved_activations_per_block_from_shapes)
{
    const int64_t B = 4, T = 32, C = 64, NH = 4, NKV = 2, F = 176;
    int64_t want = 4 * (B * T * C * (2 + 1 + 1 + 2) + 2 * B * NKV * T * (C / NH) + B * NH * T + 4 * B * T * F);
    Plan *p = compile("llama.fsm", LLAMA, 7, NULL, 0);
    MemReport *r = report(p);
    for (int32_t b = 0; b < p->n_blocks; b++)
        cr_expect_eq(r->saved_by_block[b], want, "block %s: %ld saved bytes, expected %ld", plan_str(p, p->blocks[b].name),
                     (long)r->saved_by_block[b], (long)want);
    report_mem_free(r);
    plan_free(p);
}

/* Bytes of the optimizer's scalar bookkeeping (its step count): not per param. */
static int64_t scalar_state(const Plan *p)
{
    int64_t b = 0;
    for (int32_t i = 0; i < p->n_tensors; i++)
        if (p->tensors[i].role == PLAN_ROLE_OPT_STATE && p->tensors[i].rank == 0) b += plan_tensor_nbytes(&p->tensors[i]);
    return b;
}

Test(memreport, model_state_per_param_is_zero_accounting)
{
    /* AdamW in fp32: 4 (params) + 4 (grads) + 8 (m, v) bytes per param; SGD with
     * momentum: 4 + 4 + 4; plus the optimizer's step count. Sharded strategies and
     * mixed precision are checked by test_zero_formulas. */
    Plan *g = compile("gpt2.fsm", GPT2, 6, NULL, 0), *m = compile("mlp.fsm", NULL, 0, NULL, 0);
    MemReport *rg = report(g), *rm = report(m);
    cr_expect_eq(rg->param_count, plan_meta_int(g, "params", -1));
    cr_expect_eq(rg->state[MEM_PARAMS32], 4 * rg->param_count);
    cr_expect_eq(rg->state[MEM_GRADS32], 4 * rg->param_count);
    cr_expect_eq(rg->state[MEM_OPT_STATE], 8 * rg->param_count + scalar_state(g));
    cr_expect_eq(rg->state[MEM_PARAMS16] + rg->state[MEM_GRADS16], 0, "no 16-bit copies in fp32");
    cr_expect_eq(report_state_sum(rm->state), 12 * rm->param_count + scalar_state(m));
    report_mem_free(rg);
    report_mem_free(rm);
    plan_free(g);
    plan_free(m);
}

/* A 16-bit copy of a param is 16-bit params whatever made it: the casts of an unsharded
 * or ddp plan's forward (and of a recompute), zero2's gathers (kept for the step), the
 * shards fsdp casts to gather, and the 16-bit params the update writes and keeps
 * (cast_in_update: instead of those casts but a frozen unit's); fsdp's gathers themselves
 * are per use, "gathered params". None of them is an activation, saved or not. */
Test(memreport, param_copies_are_16bit_params_not_activations)
{
    static const char *const runs[][3] = {
        {"none", "1", "none"}, {"none", "1", "Block"}, {"ddp", "2", "none"}, {"zero2", "2", "none"}, {"fsdp", "2", "Block"},
    };
    for (size_t k = 0; k < sizeof runs / sizeof *runs; k++) {
        Setting set[] = {{"shard", runs[k][0]}, {"world", runs[k][1]}, {"recompute", runs[k][2]}, {"precision", "bf16"}};
        Plan *p = compile("gpt2.fsm", GPT2, 6, set, 4);
        MemReport *r = report(p);
        int copies = 0;
        for (int32_t i = 0; i < p->n_ops; i++) {
            const PlanOp *op = &p->ops[i];
            const char *name = plan_str(p, op->op);
            int32_t out = p->ids[op->out];
            if (!op->n_in || p->tensors[out].alias != PLAN_NONE) continue;
            const PlanTensor *in = &p->tensors[p->ids[op->in]];
            if (!strcmp(name, "cast") && in->role == PLAN_ROLE_PARAM) {
                copies++;
                cr_expect_eq(r->cat[out], MEM_PARAMS16, "%s recompute %s: op %d (%s) casts param %s into %s", runs[k][0],
                             runs[k][2], i, plan_phase_name(op->phase), plan_str(p, in->name),
                             report_category_name((MemCategory)r->cat[out]));
            }
            if (!strcmp(name, "all_gather") && p->tensors[out].dtype == PLAN_DT_BF16)
                cr_expect_eq(r->cat[out], strcmp(runs[k][0], "fsdp") || op->block == PLAN_NONE ? MEM_PARAMS16 : MEM_GATHERED,
                             "%s: op %d gathers into %s", runs[k][0], i, report_category_name((MemCategory)r->cat[out]));
        }
        for (int32_t t = 0; t < p->n_tensors; t++)
            if (p->tensors[t].role == PLAN_ROLE_PARAM16 && p->tensors[t].alias == PLAN_NONE) {
                copies++;
                cr_expect_eq(r->cat[t], MEM_PARAMS16, "%s: %s is %s", runs[k][0], plan_str(p, p->tensors[t].name),
                             report_category_name((MemCategory)r->cat[t]));
            }
        cr_expect_gt(copies, 0, "%s: the plan casts its params, or its updates write them", runs[k][0]);
        report_mem_free(r);
        plan_free(p);
    }
}

/* ---- golden text ---------------------------------------------------------------------- */

static void check_golden(Plan *p, const char *name)
{
    MemReport *r = report(p);
    char *text = capture(report_mem_print, NULL, r), path[512];
    snprintf(path, sizeof path, "%s/tests/golden_mem/%s.txt", FS_SOURCE_DIR, name);
    if (getenv("FS_UPDATE_GOLDEN")) {
        FILE *f = fopen(path, "w");
        cr_assert_not_null(f, "%s", path);
        fputs(text, f);
        fclose(f);
    }
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s: missing; run with FS_UPDATE_GOLDEN=1 to create it", path);
    static char want[1 << 16];
    size_t n = fread(want, 1, sizeof want - 1, f);
    fclose(f);
    want[n] = 0;
    cr_expect_str_eq(text, want, "%s differs from the report (FS_UPDATE_GOLDEN=1 regenerates it):\n%s", path, text);
    free(text);
    report_mem_free(r);
    plan_free(p);
}

Test(memreport, golden_mlp) { check_golden(compile("mlp.fsm", NULL, 0, NULL, 0), "mlp"); }

static const Define TINY[] = {{"L", 2}, {"C", 32}, {"NH", 2}, {"T", 16}, {"V", 64}, {"B", 2}};

Test(memreport, golden_tiny_gpt2) { check_golden(compile("gpt2.fsm", TINY, 6, NULL, 0), "gpt2_tiny"); }

/* ZeRO's categories under mixed precision: 16-bit params and grads apart from fp32's,
 * the count without the fp32 grads, and fsdp's per-use gathers. */
Test(memreport, golden_tiny_gpt2_fsdp_bf16)
{
    Setting set[] = {{"shard", "fsdp"}, {"world", "2"}, {"precision", "bf16"}};
    check_golden(compile("gpt2.fsm", TINY, 6, set, 3), "gpt2_tiny_fsdp_bf16");
}

/* ---- JSON ----------------------------------------------------------------------------- */

Test(memreport, json_parses_and_agrees_with_the_text)
{
    Plan *p = compile("gpt2.fsm", GPT2, 6, NULL, 0);
    MemReport *r = report(p);
    char *text = capture(report_mem_print, NULL, r), *js = capture(NULL, report_mem_json, r), buf[128], num[64];
    json_error_t je;
    json_t *o = json_loads(js, 0, &je);
    cr_assert_not_null(o, "JSON: %s at line %d", je.text, je.line);
    int64_t arena = json_integer_value(json_object_get(o, "arena_bytes")), peak = json_integer_value(json_object_get(o, "peak_bytes"));
    cr_expect_eq(arena, r->arena_bytes);
    snprintf(buf, sizeof buf, "(%s bytes)", report_grouped(arena, num, sizeof num));
    cr_expect(strstr(text, buf), "text lacks the arena %s", buf);
    snprintf(buf, sizeof buf, "(%s bytes) at op %d", report_grouped(peak, num, sizeof num),
             (int)json_integer_value(json_object_get(json_object_get(o, "peak_op"), "index")));
    cr_expect(strstr(text, buf), "text lacks the peak '%s'", buf);
    cr_expect(strstr(text, json_string_value(json_object_get(json_object_get(o, "peak_op"), "where"))));
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(o, "ranks"), "label")), "rank 0");
    /* Categories sum to the peak; each one's at-peak bytes is in the text's row. */
    json_t *cats = json_object_get(o, "categories"), *c;
    size_t i;
    int64_t sum = 0;
    json_array_foreach(cats, i, c) sum += json_integer_value(json_object_get(c, "at_peak"));
    cr_expect_eq(sum, peak);
    cr_expect_eq(json_array_size(cats), MEM_CAT_COUNT);
    /* The largest tensors, in the text's order. */
    json_t *top = json_object_get(o, "top_tensors"), *t;
    const char *at = text;
    json_array_foreach(top, i, t) {
        snprintf(buf, sizeof buf, "\n    %s ", json_string_value(json_object_get(t, "name")));
        const char *hit = strstr(at, buf);
        cr_expect(hit, "top tensor %zu '%s' not in the text after the previous one", i, buf + 5);
        if (hit) at = hit + 1;
    }
    snprintf(buf, sizeof buf, "%.2f bytes/param",
             json_real_value(json_object_get(json_object_get(o, "model_state"), "bytes_per_param")));
    cr_expect(strstr(text, buf), "text lacks '%s'", buf);
    json_decref(o);
    free(text), free(js);
    report_mem_free(r);
    plan_free(p);
}

/* ---- HTML ----------------------------------------------------------------------------- */

static int count(const char *s, const char *what)
{
    int n = 0;
    for (const char *at = strstr(s, what); at; at = strstr(at + 1, what)) n++;
    return n;
}

/* Every element closed in order: <a ...> ... </a>, or <a .../>; void HTML elements
 * (meta) need no end. Returns 0 or the offset of the first mismatch. */
static long check_nesting(const char *s)
{
    const char *stack[256];
    size_t len[256];
    int depth = 0;
    for (const char *at = strchr(s, '<'); at; at = strchr(at + 1, '<')) {
        if (at[1] == '!') continue;
        const char *end = strchr(at, '>');
        if (!end) return at - s;
        int closing = at[1] == '/';
        const char *name = at + 1 + closing;
        size_t n = strcspn(name, " />\n");
        if (end[-1] == '/' || (n == 4 && !strncmp(name, "meta", 4))) continue;
        if (!closing) {
            if (depth == 256) return at - s;
            stack[depth] = name, len[depth++] = n;
        } else if (!depth || len[depth - 1] != n || strncmp(stack[depth - 1], name, n)) {
            return at - s;
        } else {
            depth--;
        }
    }
    return depth ? -1 : 0;
}

Test(memreport, html_is_one_well_formed_page_with_a_tooltip_per_column)
{
    Plan *p = compile("gpt2.fsm", GPT2, 6, NULL, 0);
    MemReport *r = report(p);
    char *html = capture(NULL, report_mem_html, r);
    cr_expect(!strncmp(html, "<!DOCTYPE html>", 15));
    cr_expect_eq(count(html, "<svg"), 1);
    cr_expect_eq(count(html, "</svg>"), 1);
    int cols = p->n_ops < 600 ? p->n_ops : 600;
    cr_expect_eq(count(html, "<g class=\"col\"><title>"), cols, "%d tooltips for %d columns",
                 count(html, "<g class=\"col\"><title>"), cols);
    cr_expect_eq(count(html, "<title>"), count(html, "</title>"));
    long bad = check_nesting(html);
    cr_expect_eq(bad, 0, "tags do not nest at offset %ld: %.80s", bad, bad > 0 ? html + bad : "");
    /* Self-contained: no stylesheets, images, fonts or scripts from anywhere; one inline
     * script (the zoom) per chart, and url() only of the page's own clip path. */
    cr_expect(!strstr(html, "<link") && !strstr(html, "src=") && !strstr(html, "@import"));
    cr_expect_eq(count(html, "<script>"), 1);
    cr_expect_eq(count(html, "url("), count(html, "url(#plot-"));
    cr_expect(strstr(html, "class=\"peak\""), "the peak is marked");
    cr_expect(strstr(html, "MiB</text>"), "the axis is labelled in binary units");
    cr_expect(strstr(html, "saved for backward"), "the legend names the categories");
    cr_expect(strstr(html, "Model state, as ZeRO counts it: 16.00 bytes/param"), "the legend says the model state");
    free(html);
    report_mem_free(r);
    plan_free(p);
}

Test(memreport, html_of_a_large_schedule_has_at_most_600_columns)
{
    static const Define BIG[] = {{"L", 24}, {"C", 64}, {"NH", 4}, {"T", 32}, {"V", 256}, {"B", 4}};
    Plan *p = compile("gpt2.fsm", BIG, 6, NULL, 0);
    cr_assert_gt(p->n_ops, 600);
    MemReport *r = report(p);
    char *html = capture(NULL, report_mem_html, r);
    cr_expect_eq(count(html, "<g class=\"col\"><title>"), 600);
    cr_expect_eq(check_nesting(html), 0);
    free(html);
    report_mem_free(r);
    plan_free(p);
}

/* ---- sizes, limits, hostile plans --------------------------------------------------- */

Test(memreport, sizes_parse_with_every_unit)
{
    static const struct {
        const char *text;
        int64_t bytes;
    } ok[] = {
        {"80GiB", 80ll << 30}, {"512MiB", 512ll << 20}, {"1.5 TiB", 3ll << 39}, {"4KiB", 4096}, {"100B", 100},
        {"1KB", 1000}, {"2MB", 2000000}, {"80GB", 80000000000ll}, {"1TB", 1000000000000ll}, {"3gib", 3ll << 30},
    };
    char err[256];
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        int64_t b = 0;
        cr_expect_eq(report_size_parse(ok[i].text, &b, err, sizeof err), 0, "%s: %s", ok[i].text, err);
        cr_expect_eq(b, ok[i].bytes, "%s: %ld", ok[i].text, (long)b);
    }
    static const struct {
        const char *text, *why;
    } bad[] = {
        {"80", "has no unit"}, {"80GX", "unknown unit 'GX'"}, {"GiB", "not a size"}, {"-1GiB", "not a size"},
        {"0.1B", "out of range"}, {"80 G", "unknown unit 'G'"}, {"9000PB", "unknown unit"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int64_t b = 0;
        cr_expect_eq(report_size_parse(bad[i].text, &b, err, sizeof err), -1, "%s parsed", bad[i].text);
        cr_expect(strstr(err, bad[i].why), "%s: '%s' lacks '%s'", bad[i].text, err, bad[i].why);
    }
}

Test(memreport, limit_message_says_by_how_much_and_what_would_cut_it)
{
    Plan *p = compile("gpt2.fsm", GPT2, 6, NULL, 0);
    MemReport *r = report(p);
    int64_t limit = r->arena_bytes - (1 << 20);
    MemWhatIf w[3] = {{"-D B=2", "half the batch (B 4 -> 2)", r->arena_bytes - (2 << 20), 0},
                      {"--recompute Block", "recompute", r->arena_bytes - 1000, 0},
                      {"--nothing", "does not compile", -1, 0}};
    cr_expect(report_over_limit(r, limit));
    cr_expect(!report_over_limit(r, r->arena_bytes));
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    report_limit_print(r, limit, w, 3, f);
    fclose(f);
    cr_expect(strstr(buf, "1.0 MiB over the limit"), "%s", buf);
    cr_expect(strstr(buf, "the peak is at op"), "%s", buf);
    cr_expect(strstr(buf, "-D B=2"), "%s", buf);
    cr_expect(strstr(buf, "(fits)"), "%s", buf);
    cr_expect(!strstr(buf, "--nothing"), "a setting that did not compile is not offered:\n%s", buf);
    cr_expect(strstr(buf, "-D B=2") < strstr(buf, "--recompute"), "best first:\n%s", buf);
    free(buf);
    report_mem_free(r);
    plan_free(p);
}

Test(memreport, limit_message_offers_what_trains_the_same_first)
{
    Plan *p = compile("gpt2.fsm", GPT2, 6, NULL, 0);
    MemReport *r = report(p);
    int64_t limit = r->arena_bytes - (1 << 20);
    MemWhatIf w[2] = {{"-D B=2", "half the batch (B 4 -> 2)", r->arena_bytes - 600000, 1},
                      {"--microbatches 2", "accumulate", r->arena_bytes - 300000, 0}};
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    report_limit_print(r, limit, w, 2, f);
    fclose(f);
    cr_expect(strstr(buf, "--microbatches 2") && strstr(buf, "-D B=2"), "%s", buf);
    cr_expect(strstr(buf, "--microbatches 2") < strstr(buf, "-D B=2"), "a smaller batch last, though smaller:\n%s", buf);
    cr_expect(strstr(buf, "(changes the training)") > strstr(buf, "-D B=2"), "%s", buf);
    free(buf);
    report_mem_free(r);
    plan_free(p);
}

Test(memreport, hostile_plans_are_reported_without_a_crash)
{
    Plan *p = plan_new();
    cr_assert_not_null(p);
    plan_set_one_program(p, 1, 1 << 20, 0);
    plan_meta_set_int(p, "world", -5);
    PlanTensor t = {.name = plan_intern(p, "\x1b[31mred"), .rank = 1, .shape = {1000}, .block = PLAN_NONE,
                    .producer = PLAN_NONE, .tied_to = PLAN_NONE, .grad = PLAN_NONE, .alias = PLAN_NONE,
                    .unit = PLAN_NONE, .live_start = -7, .live_end = 1 << 30};
    plan_tensor_add(p, &t);
    t.alias = 2, t.live_start = 5, t.live_end = 2;
    plan_tensor_add(p, &t);
    t.alias = 1;
    plan_tensor_add(p, &t);  // 1 and 2: a cycle
    char err[256];
    cr_assert_eq(plan_check(p, err, sizeof err), 0, "%s", err);
    MemReport *r = report(p);
    char *text = capture(report_mem_print, NULL, r), *js = capture(NULL, report_mem_json, r),
         *html = capture(NULL, report_mem_html, r);
    cr_expect(!strchr(text, '\x1b'), "control bytes are cleaned");
    cr_expect(strstr(text, "rank 0"));
    free(text), free(js), free(html);
    report_mem_free(r);
    plan_free(p);
    Plan *none = plan_new();
    cr_expect_null(report_mem_new(none, err, sizeof err));
    cr_expect(strstr(err, "no memory plan"), "%s", err);
    plan_free(none);
}

/* ---- plans of several programs (pipeline stages) ----------------------------------- */

/* gpt2 at B = 4 and B = 8 (the same blocks) as stages 0 and 1 of one plan, 2
 * data-parallel ranks each; one[k] is stage k's program alone. */
static Plan *two_stages(Plan **one)
{
    static const Define B8[] = {{"L", 2}, {"C", 64}, {"NH", 4}, {"T", 32}, {"V", 256}, {"B", 8}};
    Setting set[] = {{"shard", "ddp"}, {"world", "2"}};
    char err[256];
    one[0] = compile("gpt2.fsm", GPT2, 6, set, 2);
    one[1] = compile("gpt2.fsm", B8, 6, set, 2);
    Plan *p = plan_new();
    cr_assert_not_null(p);
    for (int k = 0; k < 2; k++) cr_assert_eq(plan_append_program(p, one[k], err, sizeof err), 0, "%s", err);
    cr_assert_eq(plan_check(p, err, sizeof err), 0, "%s", err);
    return p;
}

static MemStages *stages(const Plan *p)
{
    char err[256];
    MemStages *s = report_stages_new(p, err, sizeof err);
    cr_assert_not_null(s, "%s", err);
    return s;
}

/* The same of every stage's reports. */
static char *capture_stages(void (*fn)(const MemStages *, FILE *), int (*fn_rc)(const MemStages *, FILE *),
                            const MemStages *s)
{
    char *buf = NULL;
    CAPTURE(buf, if (fn) fn(s, f); if (fn_rc) cr_assert_eq(fn_rc(s, f), 0));
    return buf;
}

Test(memreport, each_stage_is_reported_as_its_program_alone)
{
    Plan *one[2], *p = two_stages(one);
    MemStages *s = stages(p);
    cr_assert_eq(s->n, 2);
    cr_expect_eq(s->largest, 1, "B = 8 needs the larger arena");
    char *text = capture_stages(report_stages_print, NULL, s);
    cr_expect(strstr(text, "memory plan: gpt2, 2 pipeline stages x 2 data-parallel ranks (world 4); bytes per rank\n"),
              "%s", text);
    cr_expect(strstr(text, "  largest arena: stage 1 of 2 (ranks 2-3), "), "%s", text);
    for (int k = 0; k < 2; k++) {
        MemReport *alone = report(one[k]);
        const MemReport *r = s->stage[k];
        cr_expect_eq(r->stage, k);
        cr_expect_eq(r->n_stages, 2);
        cr_expect_eq(r->arena_bytes, alone->arena_bytes, "stage %d", k);
        cr_expect_eq(r->peak[PLAN_PLACE_DEVICE], alone->peak[PLAN_PLACE_DEVICE], "stage %d", k);
        cr_expect_eq(r->peak_at[PLAN_PLACE_DEVICE], alone->peak_at[PLAN_PLACE_DEVICE], "stage %d", k);
        cr_expect_eq(r->param_count, alone->param_count, "stage %d", k);
        /* The stage's report is the program's, but for its first line. */
        char *want = capture(report_mem_print, NULL, alone), head[128];
        snprintf(head, sizeof head, "memory plan: gpt2, stage %d of 2 (ranks %d-%d), 2 data-parallel ranks; bytes per "
                 "rank\n", k, 2 * k, 2 * k + 1);
        const char *at = strstr(text, head);
        cr_expect(at, "'%s' not in:\n%s", head, text);
        const char *rest = strchr(want, '\n') + 1;
        if (at) cr_expect(!strncmp(at + strlen(head), rest, strlen(rest)), "stage %d differs from its program:\n%s", k, at);
        free(want);
        report_mem_free(alone);
    }
    free(text);
    report_stages_free(s);
    plan_free(p), plan_free(one[0]), plan_free(one[1]);
}

/* A pipeline in bf16 (1F1B, 4 micro-batches, 2 of them in flight on stage 0): one
 * 16-bit copy of each stage's params all step, 2 bytes a param, as the model-state line
 * says, not one per micro-batch in flight. */
Test(memreport, pipeline_stages_hold_one_16bit_copy)
{
    Setting set[] = {{"stages", "2"}, {"microbatches", "4"}, {"world", "2"}, {"precision", "bf16"}};
    Plan *p = compile("gpt2.fsm", GPT2, 6, set, 4);
    MemStages *s = stages(p);
    cr_assert_eq(s->n, 2);
    for (int k = 0; k < 2; k++) {
        const MemReport *r = s->stage[k];
        cr_expect_eq(r->state[MEM_PARAMS16], 2 * r->param_count, "stage %d: 16-bit params %lld bytes for %lld params",
                     k, (long long)r->state[MEM_PARAMS16], (long long)r->param_count);
        cr_expect_eq(r->max_cat[PLAN_PLACE_DEVICE][MEM_PARAMS16], r->state[MEM_PARAMS16],
                     "stage %d: 16-bit params reach %lld bytes, one copy is %lld", k,
                     (long long)r->max_cat[PLAN_PLACE_DEVICE][MEM_PARAMS16], (long long)r->state[MEM_PARAMS16]);
    }
    report_stages_free(s);
    plan_free(p);
}

Test(memreport, one_program_through_the_stages_prints_as_before)
{
    Plan *p = compile("gpt2.fsm", GPT2, 6, NULL, 0);
    MemReport *r = report(p);
    MemStages *s = stages(p);
    char *a = capture(report_mem_print, NULL, r), *b = capture_stages(report_stages_print, NULL, s);
    cr_expect_str_eq(a, b);
    free(a), free(b);
    a = capture(NULL, report_mem_json, r), b = capture_stages(NULL, report_stages_json, s);
    cr_expect_str_eq(a, b);
    free(a), free(b);
    a = capture(NULL, report_mem_html, r), b = capture_stages(NULL, report_stages_html, s);
    cr_expect_str_eq(a, b);
    free(a), free(b);
    report_stages_free(s);
    report_mem_free(r);
    plan_free(p);
}

Test(memreport, json_has_a_stages_array_with_each_stages_ranks)
{
    Plan *one[2], *p = two_stages(one);
    MemStages *s = stages(p);
    char *js = capture_stages(NULL, report_stages_json, s);
    json_error_t je;
    json_t *o = json_loads(js, 0, &je);
    cr_assert_not_null(o, "JSON: %s at line %d", je.text, je.line);
    cr_expect_eq(json_integer_value(json_object_get(o, "n_stages")), 2);
    cr_expect_eq(json_integer_value(json_object_get(o, "world")), 4);
    cr_expect_eq(json_integer_value(json_object_get(o, "dp_world")), 2);
    cr_expect_eq(json_integer_value(json_object_get(json_object_get(o, "largest_stage"), "stage")), 1);
    json_t *a = json_object_get(o, "stages");
    cr_assert_eq(json_array_size(a), 2);
    for (int k = 0; k < 2; k++) {
        json_t *st = json_array_get(a, (size_t)k), *ranks = json_object_get(st, "ranks");
        cr_expect_eq(json_integer_value(json_object_get(st, "stage")), k);
        cr_expect_eq(json_integer_value(json_object_get(ranks, "first")), 2 * k);
        cr_expect_eq(json_integer_value(json_object_get(ranks, "last")), 2 * k + 1);
        cr_expect_eq(json_integer_value(json_object_get(st, "arena_bytes")), s->stage[k]->arena_bytes);
        cr_expect_eq(json_array_size(json_object_get(st, "categories")), MEM_CAT_COUNT);
    }
    cr_expect_str_eq(json_string_value(json_object_get(json_array_get(a, 1), "label")), "stage 1 of 2 (ranks 2-3)");
    json_decref(o);
    free(js);
    report_stages_free(s);
    plan_free(p), plan_free(one[0]), plan_free(one[1]);
}

Test(memreport, html_has_a_section_per_stage_and_the_schedule)
{
    Plan *one[2], *p = two_stages(one);
    MemStages *s = stages(p);
    char *html = capture_stages(NULL, report_stages_html, s);
    cr_expect_eq(count(html, "<svg"), 3, "the lanes and each stage's memory");
    cr_expect_eq(count(html, "<section>"), 2);
    cr_expect(strstr(html, "<h2 id=\"stage-1\">Stage 1 of 2 (ranks 2-3)</h2>"));
    cr_expect(strstr(html, "<a href=\"#stage-1\">1</a> (largest)"));
    cr_expect(strstr(html, "Schedule, a lane per stage"));
    cr_expect(strstr(html, "class=\"tl-f\"") && strstr(html, "class=\"tl-b\""), "forward and backward boxes");
    long bad = check_nesting(html);
    cr_expect_eq(bad, 0, "tags do not nest at offset %ld: %.80s", bad, bad > 0 ? html + bad : "");
    cr_expect(!strstr(html, "<link") && !strstr(html, "src=") && count(html, "url(") == count(html, "url(#plot-"));
    cr_expect_eq(count(html, "<script>"), 2, "one zoom script per stage's chart");
    cr_expect(strstr(html, "clipPath id=\"plot-0\"") && strstr(html, "clipPath id=\"plot-1\""), "a clip path of its own per chart");
    free(html);
    report_stages_free(s);
    plan_free(p), plan_free(one[0]), plan_free(one[1]);
}

Test(memreport, the_limit_is_the_largest_stages)
{
    Plan *one[2], *p = two_stages(one);
    MemStages *s = stages(p);
    const MemReport *r = report_stages_largest(s);
    cr_expect_eq(r, s->stage[1]);
    cr_expect(report_over_limit(r, s->stage[0]->arena_bytes));
    char *buf = NULL;
    CAPTURE(buf, report_limit_print(r, s->stage[0]->arena_bytes, NULL, 0, f));
    cr_expect(strstr(buf, "per rank (stage 1 of 2 (ranks 2-3), the largest of the 2 stages)"), "%s", buf);
    free(buf);
    report_stages_free(s);
    plan_free(p), plan_free(one[0]), plan_free(one[1]);
}

/* The compiler's pipeline: gpt2's 4 blocks over 2 stages. A stage lists the saved bytes
 * of its own blocks only, and its params are its blocks'. */
Test(memreport, a_stage_lists_its_own_blocks)
{
    static const Define L4[] = {{"L", 4}, {"C", 64}, {"NH", 4}, {"T", 32}, {"V", 256}, {"B", 8}};
    Setting set[] = {{"stages", "2"}, {"microbatches", "2"}, {"world", "2"}};
    Plan *p = compile("gpt2.fsm", L4, 6, set, 3);
    cr_assert_eq(p->n_programs, 2);
    MemStages *s = stages(p);
    int64_t params = 0;
    for (int k = 0; k < 2; k++) {
        char *text = capture(report_mem_print, NULL, s->stage[k]);
        const char *saved = strstr(text, "saved for backward, by the block");
        cr_assert(saved, "%s", text);
        cr_expect(strstr(saved, k ? "    h.2 " : "    h.0 "), "stage %d:\n%s", k, saved);
        cr_expect(!strstr(saved, k ? "    h.0 " : "    h.2 ") && !strstr(saved, k ? "    h.1 " : "    h.3 "),
                  "stage %d lists another stage's blocks:\n%s", k, saved);
        params += s->stage[k]->param_count;
        free(text);
    }
    cr_expect_geq(params, plan_meta_int(p, "params", -1), "the stages hold every param (tied ones twice)");
    report_stages_free(s);
    plan_free(p);
}
