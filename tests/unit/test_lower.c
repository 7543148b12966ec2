/* tests/unit/test_lower.c: lowering .fsm into the forward graph: the samples, -D
 * overrides, settings and their precedence, tied params, chained layer instances,
 * tuples, attributes and constants; and that no input crashes it. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend.h"

typedef struct {
    Graph *g;
    TrainConfig train;
    int n_errors;
    char *out;  // the diagnostics
} Result;

static Result compile_opt(const char *src, const FrontendOptions *opt)
{
    Result r = {0};
    size_t len = 0;
    FILE *mem = open_memstream(&r.out, &len);
    Diag d;
    diag_init(&d, "test.fsm", src, strlen(src), mem);
    r.g = fe_compile(src, strlen(src), opt, &r.train, &d);
    fclose(mem);
    r.n_errors = d.n_errors;
    return r;
}

static Result compile(const char *src) { return compile_opt(src, NULL); }

static void done(Result *r)
{
    ir_graph_free(r->g);
    free(r->out);
}

static char *sample(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/samples/%s", FS_SOURCE_DIR, name);
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *buf = calloc(1, (size_t)n + 1);
    cr_assert(fread(buf, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    return buf;
}

static int find_value(const Graph *g, const char *name)
{
    for (int i = 0; i < g->n_values; i++)
        if (g->values[i].name && strcmp(g->values[i].name, name) == 0) return i;
    return -1;
}

static int count_op(const Graph *g, OpKind op)
{
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++) n += g->nodes[i].op == op;
    return n;
}

static const Node *first_node(const Graph *g, OpKind op)
{
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == op) return &g->nodes[i];
    return NULL;
}

#define COMPILES(r) cr_assert((r).g, "did not compile:\n%s", (r).out)

/* ---- the samples ------------------------------------------------------------------- */

Test(lower, gpt2_sample)
{
    char *src = sample("gpt2.fsm");
    Result r = compile(src);
    COMPILES(r);
    cr_expect_eq(ir_param_count(r.g), 124439808);
    cr_expect_eq(r.g->n_blocks, 12);
    for (int i = 0; i < r.g->n_blocks; i++) {
        char name[16];
        snprintf(name, sizeof name, "h.%d", i);
        cr_expect_str_eq(r.g->blocks[i].name, name);
        cr_expect_str_eq(r.g->blocks[i].layer, "Block");
        cr_expect_eq(r.g->blocks[i].index, i);
    }
    int w = find_value(r.g, "h.11.attn.w");
    cr_assert(w >= 0);
    cr_expect_eq(r.g->values[w].block, 11);
    cr_expect_eq(r.g->values[w].role, ROLE_PARAM);
    cr_expect_eq(r.g->values[w].init, INIT_NORMAL);
    cr_expect_float_eq(r.g->values[find_value(r.g, "h.0.proj.w")].init_a, 0.02 / sqrt(24.0), 1e-12);
    cr_expect_eq(r.g->values[find_value(r.g, "tokens")].role, ROLE_INPUT);
    cr_expect_eq(r.g->values[find_value(r.g, "tokens")].dtype, DT_I32);
    cr_expect_eq(r.g->n_outputs, 1);
    const Value *loss = ir_value(r.g, r.g->outputs[0]);
    cr_expect(loss->dtype == DT_F32 && loss->rank == 0);
    cr_expect_eq(ir_verify(r.g, stderr), 0);
    /* The train block: optimizer keywords, clip and the schedule with its keywords. */
    cr_expect_eq(r.train.optimizer, OPTIM_ADAMW);
    cr_expect_float_eq(r.train.lr, 6e-4, 1e-12);
    cr_expect_float_eq(r.train.beta2, 0.95, 1e-12);
    cr_expect_float_eq(r.train.clip, 1.0, 1e-12);
    cr_expect_eq(r.train.lr_schedule, LR_COSINE);
    cr_expect_eq(r.train.warmup, 10);
    done(&r);
    free(src);
}

Test(lower, mlp_sample)
{
    char *src = sample("mlp.fsm");
    Result r = compile(src);
    COMPILES(r);
    cr_expect_eq(ir_param_count(r.g), 16 * 64 + 64 + 2 * (64 * 64 + 64) + 64 * 4 + 4);
    cr_expect_str_eq(r.g->blocks[1].name, "hidden.1");
    cr_expect_eq(r.g->n_outputs, 2);  // loss, then logits
    cr_expect_eq(r.g->values[r.g->outputs[1]].rank, 2);
    cr_expect_eq(r.train.optimizer, OPTIM_SGD);
    cr_expect_float_eq(r.train.momentum, 0.9, 1e-12);
    done(&r);
    free(src);
}

Test(lower, llama_sample)
{
    char *src = sample("llama.fsm");
    Result r = compile(src);
    COMPILES(r);
    cr_expect_eq(r.g->n_blocks, 8);
    cr_expect_eq(count_op(r.g, OP_rope), 16);
    cr_expect_eq(count_op(r.g, OP_rmsnorm), 17);
    int64_t C = 512, F = 1408, V = 32000, KV = 2 * C / 8;  // wk, wv: [C, NKV * C / NH], NKV 2 of NH 8
    cr_expect_eq(ir_param_count(r.g), 2 * V * C + C + 8 * (2 * C * C + 2 * C * KV + 2 * C + 3 * C * F));
    done(&r);
    free(src);
}

/* ---- -D ------------------------------------------------------------------------------ */

Test(lower, defines_override_dims)
{
    char *src = sample("gpt2.fsm");
    Define defs[] = {{"L", 2}, {"C", 64}, {"NH", 4}, {"T", 32}, {"V", 100}};
    FrontendOptions opt = {defs, 5, NULL, 0};
    Result r = compile_opt(src, &opt);
    COMPILES(r);
    int64_t C = 64, T = 32, V = 100, block = 12 * C * C + 13 * C;
    cr_expect_eq(ir_param_count(r.g), V * C + T * C + 2 * C + 2 * block);
    cr_expect_eq(r.g->n_blocks, 2);
    const Value *tokens = ir_value(r.g, find_value(r.g, "tokens"));
    cr_expect(tokens->shape[0] == 8 && tokens->shape[1] == 32);
    done(&r);
    free(src);
}

Test(lower, defines_feed_later_dims)
{
    const char *src = "model m {\n"
                      "  dim B = 2, C = 8, NH = 2, D = C / NH;\n"
                      "  input y: i32[B];\n"
                      "  param w: [B, D] = zeros;\n"
                      "  loss = cross_entropy(w, y);\n"
                      "}\n";
    Define defs[] = {{"C", 12}, {"NH", 3}, {"C", 24}};  // the last -D of a dim wins
    FrontendOptions opt = {defs, 3, NULL, 0};
    Result r = compile_opt(src, &opt);
    COMPILES(r);
    cr_expect_eq(r.g->values[find_value(r.g, "w")].shape[1], 8);
    done(&r);
}

/* ---- settings ------------------------------------------------------------------------ */

Test(lower, settings_command_line_wins)
{
    const char *src = "model m {\n"
                      "  dim B = 16, C = 4;\n"  // 4 data-parallel ranks x 4 micro-batches
                      "  input x: f32[B, C];\n"
                      "  input y: i32[B];\n"
                      "  layer Block { forward(h) { return gelu(h); } }\n"
                      "  loss = cross_entropy(Block(x), y);\n"
                      "}\n"
                      "train {\n"
                      "  precision bf16; world 8; shard zero3;\n"
                      "  recompute Block, all;\n"
                      "  pipeline(stages = 2, microbatches = 4, schedule = gpipe);\n"
                      "  seed 7; clip 0.5;\n"
                      "}\n";
    Setting sets[] = {{"world", "4"}, {"recompute", "none"}, {"lr", "0.01"}};
    FrontendOptions opt = {NULL, 0, sets, 3};
    Result r = compile_opt(src, &opt);
    COMPILES(r);
    cr_expect_eq(r.train.precision, PREC_BF16);
    cr_expect_eq(r.train.world, 4);
    cr_expect_eq(r.train.shard, SHARD_FSDP);
    cr_expect_str_eq(r.train.recompute, "none");
    cr_expect_eq(r.train.stages, 2);
    cr_expect_eq(r.train.microbatches, 4);
    cr_expect_eq(r.train.schedule, SCHED_GPIPE);
    cr_expect_eq(r.train.seed, 7);
    cr_expect_float_eq(r.train.clip, 0.5, 1e-12);
    cr_expect_float_eq(r.train.lr, 0.01, 1e-12);
    done(&r);

    r = compile(src);  // without the command line: the file's values, names joined by ','
    COMPILES(r);
    cr_expect_eq(r.train.world, 8);
    cr_expect_str_eq(r.train.recompute, "Block,all");
    done(&r);
}

Test(lower, settings_default_without_train_block)
{
    char *src = sample("mlp.fsm");
    char *cut = strstr(src, "train {");
    cr_assert(cut);
    *cut = 0;
    Result r = compile(src);
    COMPILES(r);
    TrainConfig def;
    config_default(&def);
    cr_expect_eq(r.train.optimizer, def.optimizer);
    cr_expect_eq(r.train.world, def.world);
    cr_expect_str_eq(r.train.recompute, def.recompute);
    done(&r);
    free(src);
}

/* ---- graph structure ------------------------------------------------------------------- */

Test(lower, tied_embedding_is_one_param)
{
    const char *src = "model m {\n"
                      "  dim B = 2, T = 4, V = 16, C = 8;\n"
                      "  input tokens: i32[B, T];\n"
                      "  param wte: [V, C] = normal(0.02);\n"
                      "  x = embedding(wte, tokens);\n"
                      "  loss = cross_entropy(x @ transpose(wte), tokens);\n"
                      "}\n";
    Result r = compile(src);
    COMPILES(r);
    int params = 0;
    for (int i = 0; i < r.g->n_values; i++) params += r.g->values[i].role == ROLE_PARAM;
    cr_expect_eq(params, 1);
    cr_expect_eq(ir_param_count(r.g), 16 * 8);
    int wte = find_value(r.g, "wte");
    const Node *emb = first_node(r.g, OP_embedding), *tr = first_node(r.g, OP_transpose);
    cr_assert(emb && tr);
    cr_expect_eq(ir_in(r.g, emb, 0), wte);
    cr_expect_eq(ir_in(r.g, tr, 0), wte);
    done(&r);
}

Test(lower, chained_instances)
{
    const char *src = "model m {\n"
                      "  dim B = 2, C = 4, L = 3;\n"
                      "  input x: f32[B, C];\n"
                      "  input y: i32[B];\n"
                      "  layer Res {\n"
                      "    param w: [C, C] = normal(0.02);\n"
                      "    forward(h, g) { return h + gelu(h @ w) * g; }\n"
                      "  }\n"
                      "  s = mean(mean(x));\n"
                      "  h = Res[L](x, s) as res;\n"
                      "  loss = cross_entropy(h, y);\n"
                      "}\n";
    Result r = compile(src);
    COMPILES(r);
    cr_assert_eq(r.g->n_blocks, 3);
    /* Each instance's matmul reads the previous instance's result, and its own w. */
    int prev = find_value(r.g, "x"), muls = 0;
    for (int i = 0; i < r.g->n_nodes; i++) {
        const Node *n = &r.g->nodes[i];
        if (n->op == OP_mean) cr_expect_eq(n->block, -1);
        if (n->op == OP_cross_entropy) cr_expect_eq(n->block, -1);
        if (n->op == OP_mul)  // g: the outer mean, the node after the first
            cr_expect_eq(ir_in(r.g, n, 1), ir_out(r.g, first_node(r.g, OP_mean) + 1, 0));
        if (n->op != OP_matmul) continue;
        char name[32];
        snprintf(name, sizeof name, "res.%d.w", muls);
        cr_expect_eq(n->block, muls);
        cr_expect_eq(ir_in(r.g, n, 0), prev);
        cr_expect_eq(ir_in(r.g, n, 1), find_value(r.g, name));
        cr_expect_eq(r.g->values[find_value(r.g, name)].block, muls);
        muls++;
        for (int j = i + 1; j < r.g->n_nodes; j++)  // the block's result: its last add
            if (r.g->nodes[j].op == OP_add && r.g->nodes[j].block == n->block)
                prev = ir_out(r.g, &r.g->nodes[j], 0);
    }
    cr_expect_eq(muls, 3);
    done(&r);
}

Test(lower, split_binds_tuple)
{
    const char *src = "model m {\n"
                      "  dim B = 2, C = 6;\n"
                      "  input x: f32[B, 3 * C];\n"
                      "  input y: i32[B];\n"
                      "  q, k, v = split(x, 3);\n"
                      "  loss = cross_entropy(q * 2 + k - v, y);\n"
                      "}\n";
    Result r = compile(src);
    COMPILES(r);
    const Node *sp = first_node(r.g, OP_split);
    cr_assert(sp);
    cr_expect_eq(sp->n_out, 3);
    cr_expect_eq(ir_attr_int(r.g, sp, "n", 0), 3);
    cr_expect_eq(ir_attr_int(r.g, sp, "axis", 0), -1);  // the default is stored
    const Node *mul = first_node(r.g, OP_mul), *add = first_node(r.g, OP_add);
    const Node *sub = first_node(r.g, OP_sub);
    cr_expect_eq(ir_in(r.g, mul, 0), ir_out(r.g, sp, 0));
    cr_expect_eq(ir_in(r.g, add, 1), ir_out(r.g, sp, 1));
    cr_expect_eq(ir_in(r.g, sub, 1), ir_out(r.g, sp, 2));
    cr_expect_eq(r.g->values[ir_out(r.g, sp, 2)].shape[1], 6);
    done(&r);
}

Test(lower, attributes_defaults_flags_and_constants)
{
    const char *src = "model m {\n"
                      "  dim B = 2, T = 4, C = 8, NH = 2;\n"
                      "  input x: f32[B, T, C];\n"
                      "  input y: i32[B, T];\n"
                      "  q = heads(x, NH);\n"
                      "  a = merge_heads(attention(q, q, q, causal));\n"
                      "  b = attention(q, q, q);\n"
                      "  t = transpose(x) + transpose(x, 1, 2) * (2 * 3 - C / NH);\n"
                      "  r = reshape(x, [B * T, -1]);\n"
                      "  z = reshape(r @ transpose(r) @ r, [B, T, C]);\n"
                      "  loss = cross_entropy(a + z - sum(x, keepdim), y);\n"
                      "}\n";
    Result r = compile(src);
    COMPILES(r);
    cr_expect_eq(ir_attr_int(r.g, first_node(r.g, OP_attention), "causal", -1), 1);
    int n_att = 0;
    for (int i = 0; i < r.g->n_nodes; i++) {
        const Node *n = &r.g->nodes[i];
        if (n->op == OP_attention && n_att++ == 1) cr_expect_eq(ir_attr_int(r.g, n, "causal", -1), 0);
        if (n->op == OP_transpose) {
            int64_t a = ir_attr_int(r.g, n, "a", 99), b = ir_attr_int(r.g, n, "b", 99);
            cr_expect((a == -2 && b == -1) || (a == 1 && b == 2));
        }
        if (n->op == OP_sum) {
            cr_expect_eq(ir_attr_int(r.g, n, "keepdim", -1), 1);
            cr_expect_eq(ir_attr_int(r.g, n, "axis", 99), -1);
        }
        if (n->op == OP_reshape) {
            int len;
            const int64_t *shape = ir_attr_ints(r.g, n, "shape", &len);
            cr_expect((len == 2 && shape[0] == 8 && shape[1] == -1) ||
                      (len == 3 && shape[0] == 2 && shape[1] == 4 && shape[2] == 8));
        }
    }
    /* `2 * 3 - C / NH` folds to one scalar, 2. */
    cr_expect_eq(count_op(r.g, OP_scalar), 1);
    cr_expect_float_eq(ir_attr_float(r.g, first_node(r.g, OP_scalar), "value", 0), 2.0, 1e-12);
    cr_expect_eq(r.g->values[ir_out(r.g, first_node(r.g, OP_scalar), 0)].rank, 0);
    done(&r);
}

Test(lower, outputs_follow_loss)
{
    const char *src = "model m {\n"
                      "  dim B = 2, C = 4;\n"
                      "  input x: f32[B, C];\n"
                      "  input y: i32[B];\n"
                      "  output h, loss, h;\n"
                      "  h = gelu(x);\n"
                      "  loss = cross_entropy(h, y);\n"
                      "}\n";
    Result r = compile(src);
    COMPILES(r);
    cr_assert_eq(r.g->n_outputs, 2);
    cr_expect_eq(r.g->nodes[r.g->values[r.g->outputs[0]].producer].op, OP_cross_entropy);
    cr_expect_eq(r.g->nodes[r.g->values[r.g->outputs[1]].producer].op, OP_gelu);
    done(&r);
}

Test(lower, errors_give_no_graph)
{
    Result r = compile("model m {\n  dim B = 2;\n  input x: f32[B];\n  loss = sum(x) + nope;\n}\n");
    cr_expect_null(r.g);
    cr_expect_eq(r.n_errors, 1);
    cr_expect(strstr(r.out, "test.fsm:4:19: error: unknown name 'nope'"), "%s", r.out);
    done(&r);
    r = compile("");
    cr_expect_null(r.g);
    cr_expect_geq(r.n_errors, 1);
    done(&r);
}

/* ---- robustness -------------------------------------------------------------------------- */

/* Every prefix and many mutations of a sample: an error or a graph, never a crash. */
Test(lower, mangled_sources_do_not_crash, .timeout = 120)
{
    char *src = sample("gpt2.fsm");
    size_t len = strlen(src);
    FILE *sink = fopen("/dev/null", "w");
    static const char pieces[] = "(){}[],;:=+-*/@ \nxLBC0123456789.e#\"";
    unsigned seed = 12345;
    for (int iter = 0; iter < 3000; iter++) {
        char *buf = malloc(len + 1);
        memcpy(buf, src, len + 1);
        size_t n = len;
        if (iter < 400) {
            n = (len * (size_t)iter) / 400;  // a prefix
        } else {
            for (int k = 0; k < 1 + iter % 4; k++) {
                seed = seed * 1103515245u + 12345u;
                size_t at = (seed >> 8) % len;
                seed = seed * 1103515245u + 12345u;
                buf[at] = pieces[(seed >> 8) % (sizeof pieces - 1)];
            }
        }
        Diag d;
        diag_init(&d, "mangled.fsm", buf, n, sink);
        TrainConfig train;
        Define defs[] = {{"L", 2}, {"V", 64}, {"T", 16}, {"C", 32}};
        FrontendOptions opt = {defs, 4, NULL, 0};
        Graph *g = fe_compile(buf, n, &opt, &train, &d);
        cr_assert(g || d.n_errors > 0, "no graph and no error at iteration %d", iter);
        ir_graph_free(g);
        free(buf);
    }
    fclose(sink);
    free(src);
}
