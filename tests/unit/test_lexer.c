/* tests/unit/test_lexer.c: the .fsm scanner (frontend/lexer.l), driven through flex's
 * reentrant API: token kinds, their text, their line:col:len, and the errors it
 * reports through Diag.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "parser.h"
#include "lexer.h"

enum { MAX_TOKS = 64 };

typedef struct {
    int kind;
    const char *text;  // the semantic value: a name's or number's text, a string's contents
    Loc loc;
} Tok;

typedef struct {
    Tok t[MAX_TOKS];
    int n;           // tokens, the final end of input included
    char *errs;      // what Diag wrote
    int n_errors;
    Arena *arena;
} Lexed;

/* Scans `len` bytes of `src` to the end (or MAX_TOKS tokens). */
static Lexed lex_n(const char *src, size_t len)
{
    Lexed r = {.arena = arena_new()};
    size_t n_errs = 0;
    FILE *errs = open_memstream(&r.errs, &n_errs);
    Diag d;
    diag_init(&d, "t.fsm", src, len, errs);
    ParseCtx c;
    fe_ctx_init(&c, r.arena, &d);
    yyscan_t sc;
    cr_assert_eq(yylex_init_extra(&c, &sc), 0);
    yy_scan_bytes(src, (int)len, sc);
    do {
        YYSTYPE v = {0};
        Tok *t = &r.t[r.n++];
        t->kind = yylex(&v, &t->loc, sc);
        t->text = t->kind == T_YYerror || t->kind == T_YYEOF ? NULL : v.str;
    } while (r.t[r.n - 1].kind != T_YYEOF && r.n < MAX_TOKS);
    yylex_destroy(sc);
    fclose(errs);
    r.n_errors = d.n_errors;
    return r;
}

static Lexed lex(const char *src) { return lex_n(src, strlen(src)); }

static void done(Lexed *r)
{
    free(r->errs);
    arena_free(r->arena);
}

static void expect_tok(const Lexed *r, int i, int kind, const char *text)
{
    cr_assert_lt(i, r->n);
    cr_assert_eq(r->t[i].kind, kind, "token %d: kind %d, want %d", i, r->t[i].kind, kind);
    if (text) cr_assert_str_eq(r->t[i].text, text, "token %d", i);
}

static void expect_loc(const Lexed *r, int i, int line, int col, int len)
{
    Loc l = r->t[i].loc;
    cr_assert(l.line == line && l.col == col && l.len == len, "token %d at %d:%d+%d, want %d:%d+%d", i,
              l.line, l.col, l.len, line, col, len);
}

Test(lexer, keywords_and_punctuation)
{
    Lexed r = lex("model train layer forward return dim input param output as {}()[],;:=+-*/@");
    static const int want[] = {T_MODEL, T_TRAIN, T_LAYER, T_FORWARD, T_RETURN, T_DIM, T_INPUT,
                               T_PARAM, T_OUTPUT, T_AS, '{', '}', '(', ')', '[', ']', ',', ';',
                               ':', '=', '+', '-', '*', '/', '@', T_YYEOF};
    cr_assert_eq(r.n, (int)(sizeof want / sizeof want[0]));
    for (int i = 0; i < r.n; i++) expect_tok(&r, i, want[i], NULL);
    cr_assert_eq(r.n_errors, 0);
    done(&r);
}

Test(lexer, names)
{
    Lexed r = lex("x _a1 ln1.w h.3.attn.w h.3 1f1b 2x.y inputs model.x as_ Block");
    const char *want[] = {"x", "_a1", "ln1.w", "h.3.attn.w", "h.3", "1f1b", "2x.y", "inputs", "model.x", "as_", "Block"};
    for (int i = 0; i < 11; i++) expect_tok(&r, i, T_NAME, want[i]);
    expect_tok(&r, 11, T_YYEOF, NULL);
    done(&r);
}

Test(lexer, numbers)
{
    Lexed r = lex("3 0.02 6e-4 1.5E+3 .5 2. 1e5 007");
    const char *want[] = {"3", "0.02", "6e-4", "1.5E+3", ".5", "2.", "1e5", "007"};
    for (int i = 0; i < 8; i++) expect_tok(&r, i, T_NUM, want[i]);
    expect_tok(&r, 8, T_YYEOF, NULL);
    done(&r);
}

Test(lexer, digits_then_letters_is_a_name)
{
    Lexed r = lex("1f1b 1e 1e5x 3.5x");
    expect_tok(&r, 0, T_NAME, "1f1b");
    expect_tok(&r, 1, T_NAME, "1e");
    expect_tok(&r, 2, T_NAME, "1e5x");
    expect_tok(&r, 3, T_NUM, "3.5");  // a number, then a name
    expect_tok(&r, 4, T_NAME, "x");
    done(&r);
}

Test(lexer, operators_split_names_and_numbers)
{
    Lexed r = lex("a-1 b*c/d@e 2-3");
    static const int want[] = {T_NAME, '-', T_NUM, T_NAME, '*', T_NAME, '/', T_NAME, '@', T_NAME,
                               T_NUM, '-', T_NUM, T_YYEOF};
    for (int i = 0; i < 14; i++) expect_tok(&r, i, want[i], NULL);
    done(&r);
}

/* `**` is one token (x ** 2), two stars apart are two: `a * *b` is a syntax error later. */
Test(lexer, power_is_one_token)
{
    Lexed r = lex("x**2 a ** -b c * *d e***f");
    static const int want[] = {T_NAME, T_POW, T_NUM, T_NAME, T_POW, '-', T_NAME, T_NAME, '*', '*', T_NAME,
                               T_NAME, T_POW, '*', T_NAME, T_YYEOF};
    for (int i = 0; i < (int)(sizeof want / sizeof *want); i++) expect_tok(&r, i, want[i], NULL);
    expect_loc(&r, 1, 1, 2, 2);
    done(&r);
}

Test(lexer, locations)
{
    Lexed r = lex("model m {\n\tx = ln1.w;\r\n  # comment\n  y  // c\n}");
    expect_loc(&r, 0, 1, 1, 5);   // model
    expect_loc(&r, 1, 1, 7, 1);   // m
    expect_loc(&r, 2, 1, 9, 1);   // {
    expect_loc(&r, 3, 2, 2, 1);   // x, after a tab (one column)
    expect_loc(&r, 4, 2, 4, 1);   // =
    expect_loc(&r, 5, 2, 6, 5);   // ln1.w
    expect_loc(&r, 6, 2, 11, 1);  // ;
    expect_loc(&r, 7, 4, 3, 1);   // y
    expect_loc(&r, 8, 5, 1, 1);   // }
    expect_tok(&r, 9, T_YYEOF, NULL);
    expect_loc(&r, 9, 5, 2, 1);   // end of input: just past the last token
    done(&r);
}

Test(lexer, end_of_input_is_on_the_last_line_with_a_token)
{
    Lexed r = lex("a +\n\n# trailing\n\n");
    expect_tok(&r, 2, T_YYEOF, NULL);
    expect_loc(&r, 2, 1, 4, 1);
    done(&r);
    Lexed e = lex("");
    expect_tok(&e, 0, T_YYEOF, NULL);
    done(&e);
}

Test(lexer, comments)
{
    Lexed r = lex("a # b c\nd // e f\ng / h #\n//\n#");
    static const int want[] = {T_NAME, T_NAME, T_NAME, '/', T_NAME, T_YYEOF};
    const char *text[] = {"a", "d", "g", NULL, "h", NULL};
    for (int i = 0; i < 6; i++) expect_tok(&r, i, want[i], text[i]);
    cr_assert_eq(r.n_errors, 0);
    done(&r);
}

Test(lexer, strings)
{
    Lexed r = lex("\"1f1b\" \"\" \"a b\"");
    expect_tok(&r, 0, T_STRING, "1f1b");
    expect_loc(&r, 0, 1, 1, 6);
    expect_tok(&r, 1, T_STRING, "");
    expect_tok(&r, 2, T_STRING, "a b");
    done(&r);
}

Test(lexer, unterminated_string)
{
    Lexed r = lex("x = \"abc\ny");
    expect_tok(&r, 2, T_YYerror, NULL);
    expect_tok(&r, 3, T_NAME, "y");  // scanning goes on with the next line
    cr_assert_eq(r.n_errors, 1);
    cr_assert_not_null(strstr(r.errs, "t.fsm:1:5: error: unterminated string"), "%s", r.errs);
    done(&r);
    Lexed e = lex("\"abc");
    expect_tok(&e, 0, T_YYerror, NULL);
    expect_tok(&e, 1, T_YYEOF, NULL);
    done(&e);
}

Test(lexer, bad_characters)
{
    Lexed r = lex("a $ b.\n ~`!");
    expect_tok(&r, 0, T_NAME, "a");
    expect_tok(&r, 1, T_YYerror, NULL);
    expect_tok(&r, 2, T_NAME, "b");
    expect_tok(&r, 3, T_YYerror, NULL);  // a dot that ends nothing
    expect_tok(&r, 4, T_YYerror, NULL);
    expect_tok(&r, 7, T_YYEOF, NULL);
    cr_assert_eq(r.n_errors, 5);
    cr_assert_not_null(strstr(r.errs, "t.fsm:1:3: error: unexpected character '$'"), "%s", r.errs);
    cr_assert_not_null(strstr(r.errs, "t.fsm:1:6: error: unexpected character '.'"), "%s", r.errs);
    cr_assert_not_null(strstr(r.errs, "t.fsm:2:2: error: unexpected character '~'"), "%s", r.errs);
    done(&r);
}

Test(lexer, nul_and_control_bytes)
{
    static const char src[] = "a\0b\x01 \x7f\"x\0y\"";
    Lexed r = lex_n(src, sizeof src - 1);
    expect_tok(&r, 0, T_NAME, "a");
    expect_tok(&r, 1, T_YYerror, NULL);
    expect_loc(&r, 1, 1, 2, 1);
    expect_tok(&r, 2, T_NAME, "b");
    expect_tok(&r, 3, T_YYerror, NULL);
    expect_tok(&r, 4, T_YYerror, NULL);
    cr_assert_not_null(strstr(r.errs, "t.fsm:1:2: error: unexpected character '\\x00'"), "%s", r.errs);
    cr_assert_not_null(strstr(r.errs, "t.fsm:1:4: error: unexpected character '\\x01'"), "%s", r.errs);
    cr_assert_not_null(strstr(r.errs, "t.fsm:1:6: error: unexpected character '\\x7F'"), "%s", r.errs);
    /* A NUL ends a string early: it is then unterminated. */
    cr_assert_not_null(strstr(r.errs, "t.fsm:1:7: error: unterminated string"), "%s", r.errs);
    done(&r);
}

Test(lexer, utf8_sequence_is_one_bad_character)
{
    Lexed r = lex("x = \xc3\xa9;");
    expect_tok(&r, 2, T_YYerror, NULL);
    expect_loc(&r, 2, 1, 5, 2);
    expect_tok(&r, 3, ';', NULL);
    cr_assert_eq(r.n_errors, 1);
    cr_assert_not_null(strstr(r.errs, "unexpected character '\xc3\xa9'"), "%s", r.errs);
    done(&r);
}

Test(lexer, length_bounds_the_input)
{
    Lexed r = lex_n("abc def", 5);
    expect_tok(&r, 0, T_NAME, "abc");
    expect_tok(&r, 1, T_NAME, "d");
    expect_tok(&r, 2, T_YYEOF, NULL);
    done(&r);
}

Test(lexer, stopped_diag_ends_the_input)
{
    char src[256] = "";
    for (int i = 0; i < 30; i++) strcat(src, "$ ");
    strcat(src, "x y z");
    Lexed r = lex(src);
    cr_assert_eq(r.n_errors, DIAG_MAX_ERRORS);
    expect_tok(&r, DIAG_MAX_ERRORS - 1, T_YYEOF, NULL);
    done(&r);
}

Test(lexer, statement_token_limit)
{
    size_t n = 2 * FE_MAX_STMT_TOKENS + 2;
    char *src = malloc(n + 1);
    for (size_t i = 0; i < n; i += 2) memcpy(src + i, "a ", 2);
    src[n] = 0;
    Arena *a = arena_new();
    char *errs = NULL;
    size_t n_errs = 0;
    FILE *out = open_memstream(&errs, &n_errs);
    Diag d;
    diag_init(&d, "t.fsm", src, n, out);
    ParseCtx c;
    fe_ctx_init(&c, a, &d);
    yyscan_t sc;
    yylex_init_extra(&c, &sc);
    yy_scan_bytes(src, (int)n, sc);
    YYSTYPE v;
    Loc l;
    for (int i = 1; i < FE_MAX_STMT_TOKENS; i++) cr_assert_eq(yylex(&v, &l, sc), T_NAME);
    cr_assert_eq(yylex(&v, &l, sc), T_YYerror);
    cr_assert_eq(yylex(&v, &l, sc), T_NAME);
    yylex_destroy(sc);
    fclose(out);
    cr_assert_not_null(strstr(errs, "statement too long"), "%s", errs);
    free(errs);
    free(src);
    arena_free(a);
}
