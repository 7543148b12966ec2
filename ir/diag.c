/* ir/diag.c: gcc-style diagnostics: `file:line:col: error: msg`, the source line, and a
 * caret under the span. Used by the frontend and the passes; stops collecting after
 * DIAG_MAX_ERRORS so a hopeless file does not bury the first, useful error. */
#include <stdlib.h>
#include <string.h>

#include "ir.h"

void diag_init(Diag *d, const char *file, const char *src, size_t src_len, FILE *out)
{
    memset(d, 0, sizeof *d);
    d->file = file ? file : "<input>";
    d->src = src;
    d->src_len = src_len;
    d->out = out ? out : stderr;
}

/* The source line `line` (1-based), quoted with a caret under [col, col+len). Tabs are
 * kept in the caret line so the caret stays aligned under them. */
static void quote_line(Diag *d, Loc loc)
{
    if (!d->src || loc.line <= 0) return;
    const char *p = d->src, *end = d->src + d->src_len;
    for (int l = 1; l < loc.line && p < end; p++)
        if (*p == '\n') l++;
    if (p >= end && loc.line > 1) return;
    const char *eol = p;
    while (eol < end && *eol != '\n') eol++;
    if (eol > p && eol[-1] == '\r') eol--;
    fputs(" ", d->out);
    for (const char *q = p; q < eol; q++)
        fputc((unsigned char)*q < 0x20 && *q != '\t' ? ' ' : *q, d->out);
    fputs("\n ", d->out);
    int col = loc.col > 0 ? loc.col : 1;
    for (int i = 1; i < col; i++) fputc(p + i - 1 < eol && p[i - 1] == '\t' ? '\t' : ' ', d->out);
    fputc('^', d->out);
    int len = loc.len;
    if (len > (int)(eol - p) - col + 1) len = (int)(eol - p) - col + 1;
    for (int i = 1; i < len; i++) fputc('~', d->out);
    fputc('\n', d->out);
}

static void emit(Diag *d, const char *kind, Loc loc, const char *fmt, va_list ap)
{
    if (loc.line > 0)
        fprintf(d->out, "%s:%d:%d: %s: ", d->file, loc.line, loc.col, kind);
    else
        fprintf(d->out, "%s: %s: ", d->file, kind);
    vfprintf(d->out, fmt, ap);
    fputc('\n', d->out);
    quote_line(d, loc);
}

void diag_verror(Diag *d, Loc loc, const char *fmt, va_list ap)
{
    if (d->stopped) return;
    d->n_errors++;
    emit(d, "error", loc, fmt, ap);
    if (d->n_errors >= DIAG_MAX_ERRORS) {
        fprintf(d->out, "%s: note: stopping after %d errors\n", d->file, DIAG_MAX_ERRORS);
        d->stopped = 1;
    }
}

void diag_error(Diag *d, Loc loc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    diag_verror(d, loc, fmt, ap);
    va_end(ap);
}

void diag_warning(Diag *d, Loc loc, const char *fmt, ...)
{
    if (d->stopped) return;
    d->n_warnings++;
    va_list ap;
    va_start(ap, fmt);
    emit(d, "warning", loc, fmt, ap);
    va_end(ap);
}

void diag_note(Diag *d, Loc loc, const char *fmt, ...)
{
    if (d->stopped) return;
    va_list ap;
    va_start(ap, fmt);
    emit(d, "note", loc, fmt, ap);
    va_end(ap);
}

/* Damerau-Levenshtein distance, the optimal-string-alignment kind: insertions,
 * deletions, substitutions and swaps of two neighbours each cost 1, so the commonest
 * typo, two letters swapped ("fdsp"), is as close as one wrong letter. Three rows:
 * a swap looks two back. */
static int edit_distance(const char *a, const char *b)
{
    int la = (int)strlen(a), lb = (int)strlen(b);
    if (la > 64 || lb > 64) return 1 << 20;
    int back[65] = {0}, prev[65], cur[65];
    for (int j = 0; j <= lb; j++) prev[j] = j;
    for (int i = 1; i <= la; i++) {
        cur[0] = i;
        for (int j = 1; j <= lb; j++) {
            int sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            int d = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && back[j - 2] + 1 < d)
                d = back[j - 2] + 1;
            cur[j] = d;
        }
        memcpy(back, prev, sizeof(int) * (size_t)(lb + 1));
        memcpy(prev, cur, sizeof(int) * (size_t)(lb + 1));
    }
    return prev[lb];
}

const char *diag_closest(const char *name, const char *const *cands, int n)
{
    const char *best = NULL;
    int best_d = 1 << 20;
    for (int i = 0; i < n; i++) {
        if (!cands[i] || !strcmp(cands[i], name)) continue;
        int dist = edit_distance(name, cands[i]);
        if (dist < best_d) best_d = dist, best = cands[i];
    }
    /* Close means a typo, not a different word: about a third of the name may differ. */
    int len = (int)strlen(name);
    int limit = len <= 3 ? 1 : len / 3 + 1;
    return best_d <= limit ? best : NULL;
}

_Noreturn void fs_internal_error(const char *file, int line, const char *what)
{
    fprintf(stderr, "%s:%d: internal error: %s\n(this is a bug in fsc; please report it with the input)\n",
            file, line, what);
    abort();
}
