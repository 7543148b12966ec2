/* runtime/hfmap.c: --weights-format's tables of Hugging Face names against ours, read
 * from JSON: the built-in hf-gpt2, hf-llama and hf-bert (runtime/hf/NAME.json, embedded
 * into fsexec at build time by cmake/embed_maps.cmake, so an installed fsexec needs no
 * source tree), and a user's own, map:FILE.json, of the same form:
 *
 *   {"prefix": "bert.",                          optional: what a base model's file lacks
 *    "tensors": [
 *      {"hf": "bert.encoder.layer.{N}.attention.self.query.weight",
 *       "ours": "encoder.{N}.q.w", "transpose": true},
 *      ["bert.embeddings.word_embeddings.weight", "word_emb", false],   (hf, ours, transpose)
 *      {"hf": "cls.predictions.decoder.weight", "ours": "word_emb", "tied": true},
 *      {"hf": "bert.embeddings.position_ids", "buffer": true}]}
 *
 * A row's keys: hf, ours, transpose, tied (a copy of another row's param, checked equal
 * on load, never written), buffer (no param: skipped), optional (a file's tensor for a
 * param the model has not is skipped), if_missing and if_shape (text added to those
 * errors). The table's: tensors, prefix, and for messages about, model, covers, layout,
 * flipped. {N} stands for a block index, on both sides or neither.
 *
 * Every table is checked as it is read, each error naming the file and the row: JSON
 * that does not parse (line and column), an unknown key, a value of the wrong type, a
 * row without hf or ours, {N} on one side only, an HF name twice, one of our params in
 * two rows, a tied row whose param no other row has. (Names the model has not, and
 * shapes, are checked against the model and the file: runtime/hf.c.)
 */
#include <stdlib.h>
#include <string.h>

#include "hfmap.h"

static const char *const TOP_KEYS[] = {"about", "model", "covers", "prefix", "layout", "flipped", "tensors"};
static const char *const ROW_KEYS[] = {"hf",     "ours",     "transpose",  "tied",
                                       "buffer", "optional", "if_missing", "if_shape"};

static int listed(const char *key, const char *const *keys, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(key, keys[i])) return 1;
    return 0;
}

static const char *text_of(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

static int n_marks(const char *s)
{
    int n = 0;
    for (const char *at = s; (at = strstr(at, "{N}")); at += 3) n++;
    return n;
}

/* Row i (j: the JSON value) into r; 0, or -1 with a message. */
static int read_row(const char *src, int i, json_t *j, HfRow *r, char *err, size_t errlen)
{
    *r = (HfRow){.if_missing = "", .if_shape = ""};
    int transpose = 0, tied = 0, buffer = 0;
    if (json_is_array(j)) {  // [hf, ours] or [hf, ours, transpose]
        size_t n = json_array_size(j);
        json_t *t = n == 3 ? json_array_get(j, 2) : NULL;
        if ((n != 2 && n != 3) || !json_is_string(json_array_get(j, 0)) || !json_is_string(json_array_get(j, 1)) ||
            (t && !json_is_boolean(t)))
            return plan_fail(err, errlen, "%s: tensors[%d]: a row is [\"HF name\", \"our name\"] or [\"HF name\", "
                             "\"our name\", transpose (true or false)], or an object", src, i);
        r->hf = json_string_value(json_array_get(j, 0)), r->ours = json_string_value(json_array_get(j, 1));
        transpose = t && json_is_true(t);
    } else if (json_is_object(j)) {
        const char *key;
        json_t *v;
        json_object_foreach(j, key, v) {
            int flag = listed(key, ROW_KEYS + 2, 4), text = !flag && listed(key, ROW_KEYS, 8);
            if (!flag && !text)
                return plan_fail(err, errlen, "%s: tensors[%d]: unknown key \"%s\" (a row has hf, ours, transpose, "
                                 "tied, buffer, optional, if_missing, if_shape)", src, i, key);
            if (flag ? !json_is_boolean(v) : !json_is_string(v))
                return plan_fail(err, errlen, "%s: tensors[%d]: \"%s\" must be %s", src, i, key,
                                 flag ? "true or false" : "a string");
        }
        r->hf = json_string_value(json_object_get(j, "hf"));
        r->ours = json_string_value(json_object_get(j, "ours"));
        transpose = json_is_true(json_object_get(j, "transpose")), tied = json_is_true(json_object_get(j, "tied"));
        buffer = json_is_true(json_object_get(j, "buffer"));
        r->optional = json_is_true(json_object_get(j, "optional"));
        r->if_missing = text_of(j, "if_missing"), r->if_shape = text_of(j, "if_shape");
    } else {
        return plan_fail(err, errlen, "%s: tensors[%d]: a row is an object {\"hf\": ..., \"ours\": ...} or an array "
                         "[\"HF name\", \"our name\", transpose]", src, i);
    }
    if (!r->hf || !r->hf[0]) return plan_fail(err, errlen, "%s: tensors[%d]: no \"hf\" name", src, i);
    if (buffer && (r->ours || transpose || tied))
        return plan_fail(err, errlen, "%s: tensors[%d] ('%s'): a buffer is no param: it has no \"ours\", "
                         "\"transpose\" or \"tied\"", src, i, r->hf);
    if (!buffer && (!r->ours || !r->ours[0]))
        return plan_fail(err, errlen, "%s: tensors[%d] ('%s'): no \"ours\" name (or \"buffer\": true for a tensor that "
                         "is no param)", src, i, r->hf);
    if (tied && transpose)
        return plan_fail(err, errlen, "%s: tensors[%d] ('%s'): a tied copy is checked equal to its param as it is; "
                         "it cannot be transposed", src, i, r->hf);
    if (n_marks(r->hf) > 1 || (r->ours && (n_marks(r->ours) > 1 || n_marks(r->ours) != n_marks(r->hf))))
        return plan_fail(err, errlen, "%s: tensors[%d] ('%s'): {N}, the block index, goes once into both names or "
                         "into neither", src, i, r->hf);
    r->how = buffer ? HF_BUFFER : tied ? HF_TIED : transpose ? HF_TRANSPOSE : HF_COPY;
    return 0;
}

/* No HF name twice, none of our params in two rows, a param for every tied row. */
static int check_rows(const char *src, const HfRow *rows, int n, char *err, size_t errlen)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++) {
            if (!strcmp(rows[i].hf, rows[j].hf))
                return plan_fail(err, errlen, "%s: tensors[%d] and tensors[%d] both map HF's '%s' (a duplicate entry)",
                                 src, j, i, rows[i].hf);
            if (rows[i].how <= HF_TRANSPOSE && rows[j].how <= HF_TRANSPOSE && !strcmp(rows[i].ours, rows[j].ours))
                return plan_fail(err, errlen, "%s: tensors[%d] and tensors[%d] both map our '%s' (a duplicate entry; a "
                                 "second HF copy of one param is a \"tied\" row)", src, j, i, rows[i].ours);
        }
    for (int i = 0; i < n; i++) {
        int found = rows[i].how != HF_TIED;
        for (int j = 0; j < n && !found; j++)
            found = rows[j].how <= HF_TRANSPOSE && !strcmp(rows[j].ours, rows[i].ours);
        if (!found)
            return plan_fail(err, errlen, "%s: tensors[%d] ('%s') is a tied copy of our '%s', which no other row maps",
                             src, i, rows[i].hf, rows[i].ours);
    }
    return 0;
}

void rt_hf_map_free(RtHfMap *m)
{
    if (!m) return;
    json_decref(m->root);
    plan_dealloc(m->rows);
    plan_dealloc(m->label);
    plan_dealloc(m);
}

RtHfMap *rt_hf_map_parse(const char *text, size_t len, const char *name, int user, char *err, size_t errlen)
{
    json_error_t je;
    RtHfMap *m = plan_alloc(sizeof *m);
    size_t nl = strlen(name) + 1;
    if (!m || !(memset(m, 0, sizeof *m), m->label = plan_alloc(nl))) {
        rt_hf_map_free(m);
        plan_fail(err, errlen, "out of memory");
        return NULL;
    }
    memcpy(m->label, name, nl);
    m->name = m->label, m->user = user;
    const char *src = user ? name + 4 : name;  // map:FILE.json names the file
    json_t *top = m->root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je), *rows = json_object_get(top, "tensors");
    const char *key;
    json_t *v;
    int rc = 0;
    if (!top) rc = plan_fail(err, errlen, "%s: not a table of names (JSON): %s, line %d, column %d", src, je.text,
                             je.line, je.column);
    else if (!json_is_object(top) || !json_is_array(rows) || !json_array_size(rows))
        rc = plan_fail(err, errlen, "%s: a table is a JSON object whose \"tensors\" lists its rows: {\"tensors\": "
                       "[{\"hf\": \"HF name\", \"ours\": \"our name\", \"transpose\": false}, ...]}", src);
    json_object_foreach(rc ? NULL : top, key, v) {
        if (!listed(key, TOP_KEYS, sizeof TOP_KEYS / sizeof *TOP_KEYS)) {
            rc = plan_fail(err, errlen, "%s: unknown key \"%s\" (a table has tensors, prefix, and for messages about, "
                           "model, covers, layout, flipped)", src, key);
            break;
        }
        if (strcmp(key, "tensors") && !json_is_string(v)) {
            rc = plan_fail(err, errlen, "%s: \"%s\" must be a string", src, key);
            break;
        }
    }
    if (!rc) {
        m->n = (int)json_array_size(rows);
        if (!(m->rows = plan_alloc(sizeof *m->rows * (size_t)m->n))) rc = plan_fail(err, errlen, "out of memory");
    }
    for (int i = 0; !rc && i < m->n; i++)
        rc = read_row(src, i, json_array_get(rows, (size_t)i), &m->rows[i], err, errlen);
    if (!rc) rc = check_rows(src, m->rows, m->n, err, errlen);
    if (rc) {
        rt_hf_map_free(m);
        return NULL;
    }
    m->model = text_of(top, "model"), m->covers = text_of(top, "covers"), m->prefix = text_of(top, "prefix");
    m->layout = text_of(top, "layout"), m->flipped = text_of(top, "flipped");
    return m;
}

/* ---- --weights-format ------------------------------------------------------------------ */

static RtHfMap *read_map_file(const char *spec, char *err, size_t errlen)
{
    const char *path = spec + 4;
    FILE *f = fopen(path, "rb");
    if (!f) {
        plan_fail(err, errlen, "%s: cannot open the table", path);
        return NULL;
    }
    char *text = NULL;
    long len = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) >= 0 && len <= (1L << 26) && fseek(f, 0, SEEK_SET) == 0)
        text = plan_alloc((size_t)len + 1);
    size_t got = text ? fread(text, 1, (size_t)len, f) : 0;
    fclose(f);
    RtHfMap *m = NULL;
    if (!text || got != (size_t)len) plan_fail(err, errlen, "%s: cannot read the table (over 64 MiB?)", path);
    else m = rt_hf_map_parse(text, got, spec, 1, err, errlen);
    plan_dealloc(text);
    return m;
}

int rt_weights_format_parse(const char *s, RtWeightsFormat *out, char *err, size_t errlen)
{
    *out = RT_WEIGHTS_FSEXEC;
    if (!strcmp(s, "fsexec")) return 0;
    if (!strncmp(s, "map:", 4)) return (*out = read_map_file(s, err, errlen)) ? 0 : -1;
    for (int i = 0; i < rt_hf_n_builtin; i++) {
        const char *json = rt_hf_builtin[i].json;
        if (strcmp(s, rt_hf_builtin[i].name)) continue;
        *out = rt_hf_map_parse(json, strlen(json), s, 0, err, errlen);
        return *out ? 0 : -1;
    }
    char names[256] = "fsexec";
    size_t at = strlen(names);
    for (int i = 0; i < rt_hf_n_builtin && at < sizeof names; i++)
        at += (size_t)snprintf(names + at, sizeof names - at, ", %s", rt_hf_builtin[i].name);
    plan_fail(err, errlen, "expected %s or map:FILE.json (a table of your own), got '%s'", names, s);
    return 1;  // not a format: a usage error, not a bad file
}

void rt_weights_format_free(RtWeightsFormat f) { rt_hf_map_free((RtHfMap *)f); }

const char *rt_weights_format_name(RtWeightsFormat f) { return f ? f->name : "fsexec"; }
