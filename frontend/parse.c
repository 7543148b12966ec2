/* frontend/parse.c: runs the scanner (lexer.l) and the parser (parser.y) over one
 * buffer.
 *
 * The buffer need not end in NUL and may hold NUL bytes; flex copies it. Everything the
 * parse makes lives in the caller's Arena; the scanner's own buffers are freed here on
 * every path, including a scanner fatal error, which longjmps back to fe_parse.
 *
 * Where it sits: fe_compile -> fe_parse -> Program -> lower.c.
 */
#include <limits.h>
#include <setjmp.h>
#include <string.h>

#include "parser.h"
#include "lexer.h"

void fe_ctx_init(ParseCtx *c, Arena *a, Diag *d)
{
    memset(c, 0, sizeof *c);
    c->arena = a;
    c->diag = d;
    c->line = 1;
    c->col = 1;
}

/* The parse proper, apart so that nothing fe_parse keeps changes after setjmp. */
static void run(ParseCtx *c, const char *src, size_t len, yyscan_t scanner)
{
    jmp_buf fatal;
    c->fatal = &fatal;
    if (setjmp(fatal) == 0) {
        yy_scan_bytes(src ? src : "", (int)len, scanner);
        yyparse(scanner, c);
    }
    c->fatal = NULL;
}

Program *fe_parse(const char *src, size_t len, Arena *a, Diag *d)
{
    int before = d->n_errors;
    if (len > INT_MAX / 2) {
        diag_error(d, (Loc){0, 0, 0}, "source too large (%zu bytes)", len);
        return NULL;
    }
    ParseCtx c;
    fe_ctx_init(&c, a, d);
    yyscan_t scanner;
    if (yylex_init_extra(&c, &scanner)) {
        diag_error(d, (Loc){0, 0, 0}, "cannot start the scanner: out of memory");
        return NULL;
    }
    run(&c, src, len, scanner);
    yylex_destroy(scanner);
    return d->n_errors > before ? NULL : c.prog;
}
