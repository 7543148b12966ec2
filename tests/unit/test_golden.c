/* tests/unit/test_golden.c: every .fsm file in tests/golden through fe_compile, in process.
 *
 * A file carries its expectations in comments:
 *   # expect: 7:15: error: matmul: inner dims differ     an error at line 7, column 15
 *   # expect: error: -D CC: the model has no dim         an error with no location
 *   # args: -D B=0 --precision bf16                      -D NAME=VALUE and --key value
 * Each expected error must be printed as `NAME.fsm:L:C: error: ...SUBSTRING...`, with
 * the quoted source line and a caret line after it when it has a location; the number
 * of errors printed must equal the number expected (no cascades). A file with no
 * expectation (ok_*.fsm) must compile to a graph with no error.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend.h"

#define GOLDEN_DIR FS_SOURCE_DIR "/tests/golden"

enum { MAX_EXPECT = 16, MAX_ARGS = 16 };

typedef struct {
    char name[128];
} GoldenFile;

typedef struct {
    int line, col;  // line 0: no location
    char text[256];
} Expect;

typedef struct {
    Expect expect[MAX_EXPECT];
    int n_expect;
    Define defines[MAX_ARGS];
    Setting settings[MAX_ARGS];
    int n_defines, n_settings;
    char words[MAX_ARGS * 2][128];
    int n_words;
} Spec;

static int by_name(const void *a, const void *b)
{
    return strcmp(((const GoldenFile *)a)->name, ((const GoldenFile *)b)->name);
}

ParameterizedTestParameters(golden, files)
{
    size_t n = 0, cap = 128;
    GoldenFile *files = cr_malloc(sizeof *files * cap);
    DIR *dir = opendir(GOLDEN_DIR);
    if (!dir) {  // one case that fails on the missing directory, rather than none
        strcpy(files[0].name, "(no tests/golden directory)");
        return cr_make_param_array(GoldenFile, files, 1);
    }
    for (struct dirent *e; (e = readdir(dir));) {
        size_t len = strlen(e->d_name);
        if (len < 5 || len >= sizeof files->name || strcmp(e->d_name + len - 4, ".fsm") != 0) continue;
        if (n == cap) {
            GoldenFile *more = cr_malloc(sizeof *files * cap * 2);
            memcpy(more, files, sizeof *files * cap);
            cr_free(files);
            files = more;
            cap *= 2;
        }
        strcpy(files[n++].name, e->d_name);
    }
    closedir(dir);
    qsort(files, n, sizeof *files, by_name);
    return cr_make_param_array(GoldenFile, files, n);
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    cr_assert(fread(buf, 1, (size_t)n, f) == (size_t)n);
    buf[n] = 0;
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* `-D NAME=VALUE` and `--key value`, split at spaces. */
static void parse_args(Spec *s, const char *file, char *line)
{
    for (char *w = strtok(line, " \t\r"); w; w = strtok(NULL, " \t\r")) {
        cr_assert(s->n_words + 2 <= MAX_ARGS * 2, "%s: too many args", file);
        char *word = s->words[s->n_words++];
        snprintf(word, sizeof s->words[0], "%s", w);
        if (strcmp(word, "-D") == 0) {
            char *def = strtok(NULL, " \t\r");
            cr_assert(def && strchr(def, '='), "%s: -D needs NAME=VALUE", file);
            char *copy = s->words[s->n_words++];
            snprintf(copy, sizeof s->words[0], "%s", def);
            *strchr(copy, '=') = 0;
            s->defines[s->n_defines++] = (Define){copy, strtoll(strchr(def, '=') + 1, NULL, 10)};
        } else if (strncmp(word, "--", 2) == 0) {
            char *value = strtok(NULL, " \t\r");
            cr_assert(value, "%s: %s needs a value", file, word);
            char *copy = s->words[s->n_words++];
            snprintf(copy, sizeof s->words[0], "%s", value);
            s->settings[s->n_settings++] = (Setting){word + 2, copy};
        } else {
            cr_assert_fail("%s: cannot read the argument '%s'", file, word);
        }
    }
}

static void parse_spec(Spec *s, const char *file, const char *src)
{
    memset(s, 0, sizeof *s);
    for (const char *p = src; *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : p + strlen(p)) {
        char line[512];
        size_t n = strcspn(p, "\n");
        snprintf(line, sizeof line, "%.*s", (int)(n < sizeof line ? n : sizeof line - 1), p);
        char *at;
        if ((at = strstr(line, "# args:"))) parse_args(s, file, at + 7);
        if (!(at = strstr(line, "# expect:"))) continue;
        cr_assert(s->n_expect < MAX_EXPECT, "%s: too many expectations", file);
        Expect *e = &s->expect[s->n_expect++];
        at += 9;
        while (*at == ' ') at++;
        if (sscanf(at, "%d:%d:", &e->line, &e->col) == 2) at = strchr(strchr(at, ':') + 1, ':') + 1;
        while (*at == ' ') at++;
        cr_assert(strncmp(at, "error: ", 7) == 0, "%s: an expectation reads `L:C: error: text`", file);
        snprintf(e->text, sizeof e->text, "%s", at + 7);
    }
}

/* Output lines, split in place. */
static int split_lines(char *out, char **lines, int max)
{
    int n = 0;
    for (char *p = out; *p && n < max;) {
        lines[n++] = p;
        char *nl = strchr(p, '\n');
        if (!nl) break;
        *nl = 0;
        p = nl + 1;
    }
    return n;
}

static int is_caret_line(const char *s)
{
    while (*s == ' ' || *s == '\t') s++;
    if (*s++ != '^') return 0;
    while (*s == '~') s++;
    return *s == 0;
}

ParameterizedTest(GoldenFile *gf, golden, files)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", GOLDEN_DIR, gf->name);
    size_t len;
    char *src = slurp(path, &len);
    static Spec spec;
    parse_spec(&spec, gf->name, src);

    char *out = NULL;
    size_t out_len = 0;
    FILE *mem = open_memstream(&out, &out_len);
    Diag d;
    diag_init(&d, gf->name, src, len, mem);
    TrainConfig train;
    FrontendOptions opt = {spec.defines, spec.n_defines, spec.settings, spec.n_settings};
    Graph *g = fe_compile(src, len, &opt, &train, &d);
    fclose(mem);

    if (spec.n_expect == 0) {
        cr_expect(g != NULL && d.n_errors == 0, "%s: expected to compile, got:\n%s", gf->name, out);
    } else {
        cr_expect(g == NULL, "%s: expected errors, but it compiled", gf->name);
    }
    ir_graph_free(g);

    static char *lines[4096];
    static int used[4096];
    char *copy = strdup(out);
    int n = split_lines(copy, lines, 4096), n_err = 0;
    memset(used, 0, sizeof used);
    for (int i = 0; i < n; i++)  // not the quoted source lines, which start with a space
        n_err += strncmp(lines[i], gf->name, strlen(gf->name)) == 0 && strstr(lines[i], ": error: ");
    cr_expect(n_err == spec.n_expect, "%s: expected %d error(s), got %d:\n%s", gf->name,
              spec.n_expect, n_err, out);

    for (int k = 0; k < spec.n_expect; k++) {
        const Expect *e = &spec.expect[k];
        char prefix[256];
        if (e->line)
            snprintf(prefix, sizeof prefix, "%s:%d:%d: error: ", gf->name, e->line, e->col);
        else
            snprintf(prefix, sizeof prefix, "%s: error: ", gf->name);
        int found = -1;
        for (int i = 0; i < n && found < 0; i++)
            if (!used[i] && strncmp(lines[i], prefix, strlen(prefix)) == 0 &&
                strstr(lines[i] + strlen(prefix), e->text))
                found = i;
        cr_expect(found >= 0, "%s: expected `%s%s`, got:\n%s", gf->name, prefix, e->text, out);
        if (found < 0) continue;
        used[found] = 1;
        if (e->line)
            cr_expect(found + 2 < n && is_caret_line(lines[found + 2]),
                      "%s: no caret line under `%s`:\n%s", gf->name, lines[found], out);
    }
    free(copy);
    free(out);
    free(src);
}
