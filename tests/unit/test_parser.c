/* tests/unit/test_parser.c: the .fsm parser (frontend/parser.y, parse.c, ast_print.c).
 *
 * Snippets are parsed and compared through ast_print's S-expressions (the format is
 * documented in ast_print.c); locations are checked on the tree itself; syntax errors
 * by the text Diag writes; and truncated or random input must never crash and must
 * always be reported.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "ast.h"

/* One parse: its printed tree (NULL on errors) and what Diag wrote. */
typedef struct {
    char *ast;
    char *errs;
    int n_errors;
    int stopped;
} Parsed;

static Parsed parse_n(const char *src, size_t len)
{
    Parsed r = {0};
    size_t n_errs = 0, n_ast = 0;
    FILE *errs = open_memstream(&r.errs, &n_errs);
    Diag d;
    diag_init(&d, "t.fsm", src, len, errs);
    Arena *a = arena_new();
    Program *p = fe_parse(src, len, a, &d);
    if (p) {
        FILE *out = open_memstream(&r.ast, &n_ast);
        ast_print(p, out);
        fclose(out);
    }
    arena_free(a);
    fclose(errs);
    r.n_errors = d.n_errors;
    r.stopped = d.stopped;
    /* The contract of fe_parse: a tree exactly when there was no error. */
    cr_assert_eq(p != NULL, d.n_errors == 0, "tree %p with %d errors:\n%s", (void *)p, d.n_errors, r.errs);
    return r;
}

static Parsed parse(const char *src) { return parse_n(src, strlen(src)); }

static void done(Parsed *r)
{
    free(r->ast);
    free(r->errs);
}

/* Parses `src` and compares the tree's print with `want` (without its final newline). */
static void expect_ast(const char *src, const char *want)
{
    Parsed r = parse(src);
    cr_assert_not_null(r.ast, "parse failed:\n%s", r.errs);
    size_t n = strlen(r.ast);
    if (n && r.ast[n - 1] == '\n') r.ast[n - 1] = 0;
    cr_assert_str_eq(r.ast, want);
    done(&r);
}

/* The model's body alone: `(model m ...)` minus the wrapper. */
static void expect_body(const char *body, const char *want)
{
    char src[4096], full[4096];
    snprintf(src, sizeof src, "model m {\n%s\n}\n", body);
    snprintf(full, sizeof full, "(model m %s)", want);
    expect_ast(src, full);
}

/* Parses `src`, which has errors, and checks that `msg` is among them. */
static void expect_error(const char *src, const char *msg)
{
    Parsed r = parse(src);
    cr_assert_gt(r.n_errors, 0, "no error for:\n%s", src);
    cr_assert_not_null(strstr(r.errs, msg), "want `%s` in:\n%s", msg, r.errs);
    done(&r);
}

/* ---- trees --------------------------------------------------------------------- */

static const char *gpt_src =
    "# a comment runs to the end of the line; // does too\n"
    "model gpt2 {\n"
    "  dim B = 8, T = 1024, V = 50257, C = 768, NH = 12, L = 12;\n"
    "  input tokens: i32[B, T];\n"
    "  input targets: i32[B, T];\n"
    "\n"
    "  layer Block {\n"
    "    param ln1.w: [C] = ones;\n"
    "    param ln1.b: [C] = zeros;\n"
    "    param attn.w: [C, 3*C] = normal(0.02);\n"
    "    forward(x) {\n"
    "      q, k, v = split(layernorm(x, ln1.w, ln1.b) @ attn.w + attn.b, 3, axis = -1);\n"
    "      a = attention(heads(q, NH), heads(k, NH), heads(v, NH), causal);\n"
    "      x = x + merge_heads(a) @ proj.w + proj.b;\n"
    "      return x;\n"
    "    }\n"
    "  }\n"
    "\n"
    "  param wte: [V, C] = normal(0.02);\n"
    "  x = embedding(wte, tokens) + embedding(wpe, arange(T));\n"
    "  x = Block[L](x) as h;          # L instances, named h.0 ... h.{L-1}\n"
    "  loss = cross_entropy(x @ transpose(wte), targets);\n"
    "}\n"
    "\n"
    "train {\n"
    "  optimizer adamw(lr = 6e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1);\n"
    "  precision bf16;  shard fsdp;  world 8;  recompute Block;\n"
    "  pipeline(stages = 2, microbatches = 8, schedule = 1f1b);\n"
    "  offload optimizer;\n"
    "}\n";

Test(parser, language_md_example)
{
    expect_ast(gpt_src,
               "(model gpt2 (dim B 8) (dim T 1024) (dim V 50257) (dim C 768) (dim NH 12) (dim L 12)"
               " (input tokens i32 (B T)) (input targets i32 (B T))"
               " (layer Block (param ln1.w (C) ones) (param ln1.b (C) zeros)"
               " (param attn.w (C (* 3 C)) (call normal 0.02))"
               " (forward (x)"
               " (assign (q k v) (call split (+ (@ (call layernorm x ln1.w ln1.b) attn.w) attn.b) 3 (axis= (- 1))))"
               " (assign (a) (call attention (call heads q NH) (call heads k NH) (call heads v NH) causal))"
               " (assign (x) (+ (+ x (@ (call merge_heads a) proj.w)) proj.b))"
               " (return x)))"
               " (param wte (V C) (call normal 0.02))"
               " (assign (x) (+ (call embedding wte tokens) (call embedding wpe (call arange T))))"
               " (assign (x) (inst Block [L] x (as h)))"
               " (assign (loss) (call cross_entropy (@ x (call transpose wte)) targets)))\n"
               "(train (set optimizer adamw (lr= 6e-4) (beta1= 0.9) (beta2= 0.95) (eps= 1e-8) (weight_decay= 0.1))"
               " (set precision bf16) (set shard fsdp) (set world 8) (set recompute Block)"
               " (set pipeline (stages= 2) (microbatches= 8) (schedule= 1f1b)) (set offload optimizer))");
}

Test(parser, empty_model_and_empty_train)
{
    expect_ast("model m {}", "(model m)");
    expect_ast("model m {} train {}", "(model m)\n(train)");
}

Test(parser, dims_one_stmt_each)
{
    expect_body("dim A = 1, B = A * 2;", "(dim A 1) (dim B (* A 2))");
    expect_body("dim A = (1 + 2) * 3;", "(dim A (* (+ 1 2) 3))");
}

Test(parser, precedence_and_associativity)
{
    expect_body("x = a + b * c - d / e @ f;", "(assign (x) (- (+ a (* b c)) (@ (/ d e) f)))");
    expect_body("x = a - b - c;", "(assign (x) (- (- a b) c))");
    expect_body("x = a @ b @ c;", "(assign (x) (@ (@ a b) c))");
    expect_body("x = a / b * c;", "(assign (x) (* (/ a b) c))");
    expect_body("x = -a * b;", "(assign (x) (* (- a) b))");
    expect_body("x = a * -b;", "(assign (x) (* a (- b)))");
    expect_body("x = - -a;", "(assign (x) (- (- a)))");
    expect_body("x = -f(y) + 1;", "(assign (x) (+ (- (call f y)) 1))");
    expect_body("x = a * (b + c);", "(assign (x) (* a (+ b c)))");
    /* `**` as Python's: above unary minus on its left, right-associative, a signed exponent */
    expect_body("x = -a ** 2;", "(assign (x) (- (** a 2)))");
    expect_body("x = a ** b ** c;", "(assign (x) (** a (** b c)))");
    expect_body("x = a ** -b ** 2 + 1;", "(assign (x) (+ (** a (- (** b 2))) 1))");
    expect_body("x = 2 * a ** 0.5 @ w;", "(assign (x) (@ (* 2 (** a 0.5)) w))");
    expect_body("x = f(a) ** (C / 2);", "(assign (x) (** (call f a) (/ C 2)))");
}

Test(parser, calls_args_lists)
{
    expect_body("x = f();", "(assign (x) (call f))");
    expect_body("x = split(y, 3, axis = -1);", "(assign (x) (call split y 3 (axis= (- 1))))");
    expect_body("x = reshape(y, [B, -1]);", "(assign (x) (call reshape y (list B (- 1))))");
    expect_body("x = permute(y, []);", "(assign (x) (call permute y (list)))");
    expect_body("x = attention(q, k, v, causal);", "(assign (x) (call attention q k v causal))");
    expect_body("x = layernorm(y, w, b, eps = 1e-5);", "(assign (x) (call layernorm y w b (eps= 1e-5)))");
    expect_body("x = f(g(h(1)));", "(assign (x) (call f (call g (call h 1))))");
}

Test(parser, layer_instances)
{
    expect_body("x = Block[L](x) as h;", "(assign (x) (inst Block [L] x (as h)))");
    expect_body("x = Block[2 * L](x, y);", "(assign (x) (inst Block [(* 2 L)] x y))");
    expect_body("x = Block(x) as b0;", "(assign (x) (inst Block x (as b0)))");
    expect_body("x = Block(x);", "(assign (x) (call Block x))");
    expect_body("x = Block[1]() + 1;", "(assign (x) (+ (inst Block [1]) 1))");
}

/* Indexing: items are expressions or slices (: START STOP), `_` for an omitted side; a
 * call, a parenthesized expression and an indexed value may be indexed; the '[' is the
 * node's location. */
Test(parser, indexing_and_slices)
{
    expect_body("y = x[:, 0, :];", "(assign (y) (index x (: _ _) 0 (: _ _)))");
    expect_body("y = x[1:, :-1, a:b + 1];", "(assign (y) (index x (: 1 _) (: _ (- 1)) (: a (+ b 1))))");
    expect_body("y = f(x)[0][1:];", "(assign (y) (index (index (call f x) 0) (: 1 _)))");
    expect_body("y = (a + b)[-1] * 2;", "(assign (y) (* (index (+ a b) (- 1)) 2))");
    expect_error("model m { y = x[:, ::2]; }", "1:21: error: unexpected ':'");
    expect_error("model m { y = B[1:2](x); }", "1:18: error: the count of Layer[N](...) is one integer, not a slice");
}

Test(parser, statements)
{
    expect_body("input tokens: i32[B, T];", "(input tokens i32 (B T))");
    expect_body("input s: f32[];", "(input s f32 ())");
    expect_body("param w: [C, 3*C] = normal(0.02 / sqrt(2 * L));",
                "(param w (C (* 3 C)) (call normal (/ 0.02 (call sqrt (* 2 L)))))");
    expect_body("param w: bf16[C] = zeros;", "(param w bf16 (C) zeros)");
    expect_body("param u: [4] = uniform(-0.1, 0.1);", "(param u (4) (call uniform (- 0.1) 0.1))");
    expect_body("a, b = f(x);", "(assign (a b) (call f x))");
    expect_body("output logits;", "(output logits)");
    expect_body("output a, b;", "(output a b)");
    expect_body("layer E { param w: [1] = ones; }", "(layer E (param w (1) ones))");
    expect_body("layer E { dim H = 2; forward() { return 1; } }", "(layer E (dim H 2) (forward () (return 1)))");
    expect_body("layer E { forward(a, b) { c = a + b; return c, a; } }",
                "(layer E (forward (a b) (assign (c) (+ a b)) (return c a)))");
}

Test(parser, numbers_and_names_as_written)
{
    expect_body("x = 3 + 0.02 + 6e-4 + 1.5E+3 + .5 + 2.;", "(assign (x) (+ (+ (+ (+ (+ 3 0.02) 6e-4) 1.5E+3) .5) 2.))");
    expect_body("x = h.3.attn.w + ln1.w;", "(assign (x) (+ h.3.attn.w ln1.w))");
}

Test(parser, train_settings)
{
    expect_ast("model m {} train { recompute A, B; seed 1234; clip 1.0; name \"run 1\"; bias -2; }",
               "(model m)\n(train (set recompute A B) (set seed 1234) (set clip 1.0) (set name \"run 1\")"
               " (set bias (- 2)))");
    expect_ast("model m {} train { lr_schedule cosine(warmup = 100, min_lr = 6e-5); pipeline(); }",
               "(model m)\n(train (set lr_schedule cosine (warmup= 100) (min_lr= 6e-5)) (set pipeline))");
}

Test(parser, keywords_double_as_names)
{
    expect_body("param output: [C] = ones; x = a @ output + input;",
                "(param output (C) ones) (assign (x) (+ (@ a output) input))");
    expect_body("layer B { forward(input) { y = input; return y; } } z = B(x) as output;",
                "(layer B (forward (input) (assign (y) input) (return y))) (assign (z) (inst B x (as output)))");
    expect_body("y, model = f(dim = 1);", "(assign (y model) (call f (dim= 1)))");
    expect_ast("model model {} train { recompute layer; optimizer param(as = 1); }",
               "(model model)\n(train (set recompute layer) (set optimizer param (as= 1)))");
    /* Only where a statement starts is a keyword always a keyword. */
    expect_error("model m { output = 3; }", "t.fsm:1:18: error: expected name before '='");
}

/* ---- the tree's fields and locations ------------------------------------------- */

static Program *parse_tree(Arena *a, const char *src)
{
    Diag d;
    diag_init(&d, "t.fsm", src, strlen(src), stderr);
    Program *p = fe_parse(src, strlen(src), a, &d);
    cr_assert_not_null(p);
    return p;
}

#define ASSERT_LOC(l, ln, cl, n)                                                         \
    do {                                                                                 \
        Loc l_ = (l);                                                                    \
        cr_assert(l_.line == (ln) && l_.col == (cl) && l_.len == (n), "%s is %d:%d+%d, want %d:%d+%d", \
                  #l, l_.line, l_.col, l_.len, (ln), (cl), (n));                         \
    } while (0)

Test(parser, locations)
{
    Arena *a = arena_new();
    Program *p = parse_tree(a,
                            "model m {\n"                           // 1
                            "  dim A = 1, Bee = 22;\n"              // 2
                            "  param w: bf16[A] = normal(0.02);\n"  // 3
                            "\tq, k = a + b;\n"                     // 4
                            "  layer L { forward(x) { return x; } }\n"  // 5
                            "  y = L[A](q) as h;\n"                 // 6
                            "}\n"
                            "train { optimizer adamw(lr = 1); }\n");  // 8
    ASSERT_LOC(p->loc, 1, 1, 5);
    Stmt *s = p->body;
    ASSERT_LOC(s->loc, 2, 7, 1);
    ASSERT_LOC(s->next->loc, 2, 14, 3);
    ASSERT_LOC(s->next->value->loc, 2, 20, 2);
    cr_assert(s->next->value->is_int && s->next->value->num == 22);
    s = s->next->next;
    cr_assert_eq(s->kind, ST_PARAM);
    ASSERT_LOC(s->loc, 3, 3, 5);
    ASSERT_LOC(s->name_loc, 3, 9, 1);
    ASSERT_LOC(s->dtype_loc, 3, 12, 4);
    ASSERT_LOC(s->shape->loc, 3, 17, 1);
    ASSERT_LOC(s->value->loc, 3, 22, 6);
    ASSERT_LOC(s->value->args->value->loc, 3, 29, 4);
    cr_assert(!s->value->args->value->is_int && s->value->args->value->num == 0.02);
    s = s->next;
    ASSERT_LOC(s->loc, 4, 2, 1);  // a tab is one column
    ASSERT_LOC(s->targets->next->loc, 4, 5, 1);
    ASSERT_LOC(s->value->loc, 4, 11, 1);  // a binary expression: its operator
    ASSERT_LOC(s->value->lhs->loc, 4, 9, 1);
    s = s->next;
    ASSERT_LOC(s->loc, 5, 3, 5);
    ASSERT_LOC(s->name_loc, 5, 9, 1);
    ASSERT_LOC(s->fwd_loc, 5, 13, 7);
    ASSERT_LOC(s->targets->loc, 5, 21, 1);
    ASSERT_LOC(s->fwd->loc, 5, 26, 6);
    s = s->next;
    Expr *e = s->value;
    cr_assert_eq(e->kind, EX_INST);
    ASSERT_LOC(e->loc, 6, 7, 1);
    ASSERT_LOC(e->count->loc, 6, 9, 1);
    ASSERT_LOC(e->as_loc, 6, 18, 1);
    cr_assert_null(e->args->key);
    ASSERT_LOC(p->train_loc, 8, 1, 5);
    ASSERT_LOC(p->train->loc, 8, 9, 9);
    ASSERT_LOC(p->train->name_loc, 8, 9, 9);
    ASSERT_LOC(p->train->value->loc, 8, 19, 5);
    ASSERT_LOC(p->train->args->key_loc, 8, 25, 2);
    arena_free(a);
}

Test(parser, node_fields)
{
    Arena *a = arena_new();
    Program *p = parse_tree(a, "model m { x = Block(y) as h; z = 7 @ w; layer N { param p: [1] = ones; } }");
    Expr *e = p->body->value;
    cr_assert_eq(e->kind, EX_INST);
    cr_assert_null(e->count);
    cr_assert_str_eq(e->as_name, "h");
    cr_assert_str_eq(e->name, "Block");
    e = p->body->next->value;
    cr_assert_eq(e->op, '@');
    cr_assert_str_eq(e->lhs->text, "7");
    cr_assert(e->lhs->is_int);
    Stmt *l = p->body->next->next;
    cr_assert_eq(l->kind, ST_LAYER);
    cr_assert_eq(l->fwd_loc.line, 0);  // no forward block
    cr_assert_null(l->fwd);
    cr_assert_null(p->train);
    cr_assert_eq(p->train_loc.line, 0);
    arena_free(a);
}

/* ---- syntax errors --------------------------------------------------------------- */

Test(parser, missing_semicolon_points_after_previous_token)
{
    expect_error("model m {\n  x = 1\n  y = 2;\n}\n", "t.fsm:2:8: error: expected ';' before 'y'");
    expect_error("model m { x = 1 y = 2; }", "t.fsm:1:17: error: expected ';' before 'y'");
}

Test(parser, unexpected_token_messages)
{
    expect_error("model m { x = ; }", "t.fsm:1:15: error: unexpected ';', expected expression");
    expect_error("model m { x = f(a b); }", "t.fsm:1:19: error: unexpected 'b', expected ',' or ')'");
    expect_error("model m { x = (1 + }", "t.fsm:1:20: error: unexpected '}', expected expression");
    expect_error("model { }", "t.fsm:1:7: error: expected name before '{'");
    expect_error("model m { 3; }", "t.fsm:1:11: error: unexpected '3', expected statement or '}'");
    expect_error("model m { } junk", "t.fsm:1:13: error: unexpected 'junk', expected 'train' or end of input");
    expect_error("model m { input x: [B]; }", "t.fsm:1:20: error: expected name before '['");
    expect_error("model m { x = \"s\"; }", "t.fsm:1:15: error: unexpected \"s\", expected expression");
    expect_error("model m {} train { pipeline(stages 2); }", "t.fsm:1:36: error: expected '=' before '2'");
    expect_error("model m {} train { precision bf16 x; }", "t.fsm:1:35: error: unexpected 'x', expected ';' or ','");
    expect_error("model m {} train { optimizer adamw(0.1); }",
                 "t.fsm:1:36: error: unexpected '0.1', expected name or ')'");
}

Test(parser, end_of_input)
{
    expect_error("", "t.fsm:1:1: error: expected 'model' at end of input");
    expect_error("model m {", "t.fsm:1:10: error: unexpected end of input, expected statement or '}'");
    expect_error("model m {\n  x = a +\n\n# trailing comment\n", "t.fsm:2:10: error: unexpected end of input, expected expression");
}

Test(parser, misplaced_statements)
{
    expect_error("model m { return x; }", "t.fsm:1:11: error: 'return' is only allowed in a forward block");
    expect_error("model m { layer B { input x: f32[1]; } }",
                 "t.fsm:1:21: error: 'input' is not allowed in a layer body");
    expect_error("model m { layer B { forward(x) { param p: [1] = ones; return x; } } }",
                 "t.fsm:1:34: error: 'param' is not allowed in a forward block");
    expect_error("model m { layer B { layer C { } } }", "t.fsm:1:21: error: a layer definition is not allowed in a layer body");
    expect_error("model m { layer B { forward(x) { return x; } forward(y) { return y; } } }",
                 "t.fsm:1:46: error: a layer has one forward block; the first is at line 1");
    expect_error("model m { forward(x) { } }", "t.fsm:1:11: error: unexpected 'forward', expected statement or '}'");
}

Test(parser, bad_tokens_are_reported_once)
{
    /* Each skips to the next ';': `z = 1;` goes with the unterminated string. */
    Parsed r = parse("model m {\n  x = a $ b;\n  y = \"abc\n  z = 1;\n  w = 1 2;\n}\n");
    cr_assert_eq(r.n_errors, 3, "%s", r.errs);
    cr_assert_not_null(strstr(r.errs, "t.fsm:2:9: error: unexpected character '$'"), "%s", r.errs);
    cr_assert_not_null(strstr(r.errs, "t.fsm:3:7: error: unterminated string"), "%s", r.errs);
    cr_assert_not_null(strstr(r.errs, "t.fsm:5:9: error: expected ';' before '2'"), "%s", r.errs);
    done(&r);
}

Test(parser, several_errors_in_one_run)
{
    Parsed r = parse("model m {\n"
                     "  x = ;\n"
                     "  layer B {\n"
                     "    param w: [C] = ;\n"
                     "    forward(x) { y = x +; return y }\n"
                     "  }\n"
                     "  z = f(1,);\n"
                     "}\n"
                     "train { world; precision bf16; clip ]; }\n");
    cr_assert_not_null(strstr(r.errs, "t.fsm:2:7: error: unexpected ';'"), "%s", r.errs);
    cr_assert_not_null(strstr(r.errs, "t.fsm:4:20: error: unexpected ';'"), "%s", r.errs);
    cr_assert_not_null(strstr(r.errs, "t.fsm:5:25: error: unexpected ';'"), "%s", r.errs);
    cr_assert_not_null(strstr(r.errs, "t.fsm:5:36: error: unexpected '}', expected ';' or ','"), "%s", r.errs);
    cr_assert_not_null(strstr(r.errs, "t.fsm:7:11: error: unexpected ')'"), "%s", r.errs);
    cr_assert_not_null(strstr(r.errs, "t.fsm:9:14: error: unexpected ';', expected value"), "%s", r.errs);
    cr_assert_not_null(strstr(r.errs, "t.fsm:9:37: error: unexpected ']'"), "%s", r.errs);
    cr_assert_eq(r.n_errors, 7, "%s", r.errs);
    done(&r);
}

Test(parser, broken_headers_recover_at_their_block)
{
    /* Bison reports nothing until three tokens have been shifted after an error: the
     * `dim` keeps the second error from being swallowed. */
    Parsed r = parse("model 3 { dim A = 1;\n"
                     "  layer { x = ; }\n"
                     "  layer B(x) { }\n"
                     "  layer C { forward(x { y = ; } }\n"
                     "  w = ;\n"
                     "}\n"
                     "train { world 8 }\n");
    const char *want[] = {"t.fsm:1:7: error: expected name before '3'",
                          "t.fsm:2:9: error: expected name before '{'",
                          "t.fsm:2:15: error: unexpected ';', expected expression",
                          "t.fsm:3:10: error: expected '{' before '('",
                          "t.fsm:4:23: error: unexpected '{', expected ',' or ')'",
                          "t.fsm:4:29: error: unexpected ';', expected expression",
                          "t.fsm:5:7: error: unexpected ';', expected expression",
                          "t.fsm:7:17: error: unexpected '}', expected ';' or ','"};
    int n = (int)(sizeof want / sizeof want[0]);
    for (int i = 0; i < n; i++) cr_assert_not_null(strstr(r.errs, want[i]), "want `%s` in:\n%s", want[i], r.errs);
    cr_assert_eq(r.n_errors, n, "%s", r.errs);
    done(&r);
}

Test(parser, number_out_of_range)
{
    expect_error("model m { x = 1e999; }", "t.fsm:1:15: error: number '1e999' is out of range");
}

Test(parser, stops_after_too_many_errors)
{
    char src[4096] = "model m {\n";
    for (int i = 0; i < 40; i++) strcat(src, "  x = ;\n");
    strcat(src, "}\n");
    Parsed r = parse(src);
    cr_assert_eq(r.n_errors, DIAG_MAX_ERRORS);
    cr_assert(r.stopped);
    cr_assert_not_null(strstr(r.errs, "stopping after"), "%s", r.errs);
    done(&r);
}

/* ---- hostile input ----------------------------------------------------------------- */

static char *repeat(const char *head, const char *unit, int n, const char *tail)
{
    size_t len = strlen(head) + strlen(unit) * (size_t)n + strlen(tail) + 1;
    char *s = malloc(len);
    strcpy(s, head);
    char *p = s + strlen(head);
    for (int i = 0; i < n; i++, p += strlen(unit)) memcpy(p, unit, strlen(unit));
    strcpy(p, tail);
    return s;
}

Test(parser, deep_nesting_is_an_error_not_a_crash)
{
    char *open = repeat("model m { x = ", "(", 50000, "a");
    expect_error(open, "too deeply nested");
    free(open);
    char *neg = repeat("model m { x = ", "- ", 50000, "a; }");
    expect_error(neg, "too deeply nested");
    free(neg);
}

Test(parser, long_statement_is_an_error)
{
    char *sum = repeat("model m { x = a", " + a", 20000, "; y = ; }");
    Parsed r = parse(sum);
    cr_assert_not_null(strstr(r.errs, "statement too long"), "%s", r.errs);
    cr_assert_not_null(strstr(r.errs, "unexpected ';', expected expression"), "recovery continues:\n%s", r.errs);
    done(&r);
    free(sum);
}

Test(parser, many_statements_parse_in_linear_time)
{
    char *many = repeat("model m { ", "x = 1; layer A { param w: [1] = ones; } ", 50000, "}");
    Parsed r = parse(many);
    cr_assert_not_null(r.ast, "%s", r.errs);
    done(&r);
    free(many);
}

Test(parser, nul_bytes)
{
    static const char src[] = "model m { x = a\0; }";
    Parsed r = parse_n(src, sizeof src - 1);
    cr_assert_not_null(strstr(r.errs, "t.fsm:1:16: error: unexpected character '\\x00'"), "%s", r.errs);
    done(&r);
    /* The length given is the whole input: what follows is never read. */
    Parsed ok = parse_n("model m {}garbage", 10);
    cr_assert_not_null(ok.ast, "%s", ok.errs);
    done(&ok);
}

Test(parser, every_prefix_of_a_program)
{
    size_t n = strlen(gpt_src);
    const char *model_end = strstr(gpt_src, "}\n\ntrain");
    size_t complete = (size_t)(model_end - gpt_src) + 1;
    for (size_t i = 0; i <= n; i++) {
        Parsed r = parse_n(gpt_src, i);
        /* Up to the model's closing brace no prefix is a program; all later ones are,
         * except those that cut the train block. */
        if (i < complete) cr_assert_gt(r.n_errors, 0, "prefix %zu parsed", i);
        done(&r);
    }
}

/* The shipped samples parse, and so does every prefix of them without a crash. */
Test(parser, samples_and_their_prefixes)
{
    const char *dir = FS_SOURCE_DIR "/samples";
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "%s", dir);
    int n_files = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 4, ".fsm")) continue;
        char path[1024], *src = NULL;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        cr_assert_not_null(f, "%s", path);
        size_t len = 0, cap = 0;
        for (int ch; (ch = fgetc(f)) != EOF; src[len++] = (char)ch)
            if (len == cap) src = realloc(src, cap = cap * 2 + 4096);
        fclose(f);
        Parsed whole = parse_n(src, len);
        cr_assert_eq(whole.n_errors, 0, "%s:\n%s", path, whole.errs);
        done(&whole);
        for (size_t i = 0; i < len; i++) {
            Parsed r = parse_n(src, i);
            done(&r);
        }
        free(src);
        n_files++;
    }
    closedir(d);
    cr_assert_gt(n_files, 0);
}

/* xorshift64: a fixed sequence, so a failure reproduces. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

Test(parser, random_bytes)
{
    char buf[512];
    for (int iter = 0; iter < 2000; iter++) {
        size_t len = rnd() % sizeof buf;
        for (size_t i = 0; i < len; i++) buf[i] = (char)rnd();
        Parsed r = parse_n(buf, len);
        cr_assert_gt(r.n_errors, 0);
        done(&r);
    }
}

Test(parser, random_token_soup)
{
    static const char *const toks[] = {
        "model", "train", "layer", "forward", "return", "dim", "input", "param", "output", "as",
        "{", "}", "(", ")", "[", "]", ",", ";", ":", "=", "+", "-", "*", "/", "@",
        "x", "ln1.w", "1f1b", "3", "0.5", "6e-4", "\"s\"", "\n", "#c\n", "$"};
    int n_toks = (int)(sizeof toks / sizeof toks[0]);
    char buf[2048];
    for (int iter = 0; iter < 3000; iter++) {
        size_t len = 0;
        int n = (int)(rnd() % 60);
        if (iter % 2) len = (size_t)snprintf(buf, sizeof buf, "model m { ");
        for (int i = 0; i < n; i++)
            len += (size_t)snprintf(buf + len, sizeof buf - len, "%s ", toks[rnd() % (uint64_t)n_toks]);
        Parsed r = parse_n(buf, len);
        done(&r);
    }
}

Test(parser, mutated_program)
{
    size_t n = strlen(gpt_src);
    char *buf = malloc(n);
    static const char bytes[] = "{}()[],;:=+-*/@ \n\"#.x1";
    for (int iter = 0; iter < 2000; iter++) {
        memcpy(buf, gpt_src, n);
        for (int k = 0; k < 1 + (int)(rnd() % 4); k++)
            buf[rnd() % n] = bytes[rnd() % (sizeof bytes - 1)];
        Parsed r = parse_n(buf, n);
        done(&r);
    }
    free(buf);
}
