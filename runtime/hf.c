/* runtime/hf.c: the params under Hugging Face's names and layouts, in and out, for fsexec
 * --weights-format hf-gpt2 | hf-llama | hf-bert | map:FILE.json, by a table of rows
 * (runtime/hfmap.c reads them; runtime/hf/NAME.json are the built-in ones, README's
 * "Hugging Face weights"): a row per param pattern, our name, HF's name ({N}: the block
 * index) and how the bytes go (hfmap.h: COPY, TRANSPOSE, TIED, BUFFER). GPT-2's q, k, v
 * are fused in both (c_attn and attn.w, in that order) and Llama's and BERT's are three
 * tensors in both, so no row splits or joins. Our rope turns the pairs (i, i + D/2) of
 * each head, which is HF's rotate_half on the q_proj/k_proj it stores (those are already
 * permuted from Meta's interleaved layout by convert_llama_weights_to_hf): the rows go
 * across as they are (bench/hf_check.py holds the losses equal).
 *
 * A file may lack the table's prefix ("transformer.": GPT2Model, "model.": LlamaModel,
 * "bert.": BertModel); it is read all the same. F16 and BF16 files are upcast to our f32
 * exactly; files are written F32. Reading maps the file and checks every name, shape and
 * value before it writes a byte into the arena, then converts tensor by tensor
 * (transposes through a block of 32 rows): no copy of the model, whatever its size.
 * Writing streams through the same kind of block after rt_st_header. A user's table
 * (map:FILE) is also checked against the model: each row (but an optional one) must
 * name a param it has, so a typo is an error, not a silently skipped tensor.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "hfmap.h"

enum { BLOCK = 32, NAME = 512 };

/* ---- names -------------------------------------------------------------------------- */

/* Whether name is pat with a block index (no leading zeros) for its {N}, in *N. */
static int pat_match(const char *pat, const char *name, long *N)
{
    const char *at = strstr(pat, "{N}");
    *N = 0;
    if (!at) return !strcmp(pat, name);
    size_t head = (size_t)(at - pat);
    const char *d = name + head, *end = d;
    if (strncmp(pat, name, head)) return 0;
    while (*end >= '0' && *end <= '9' && end - d < 9) end++;
    if (end == d || (d[0] == '0' && end - d > 1) || strcmp(end, at + 3)) return 0;
    *N = strtol(d, NULL, 10);
    return 1;
}

static const char *pat_fill(const char *pat, long N, char *buf, size_t n)
{
    const char *at = strstr(pat, "{N}");
    if (!at) snprintf(buf, n, "%s", pat);
    else snprintf(buf, n, "%.*s%ld%s", (int)(at - pat), pat, N, at + 3);
    return buf;
}

/* The COPY or TRANSPOSE row of table f for our param `ours` (its block index in *N). */
static const HfRow *row_of_ours(RtWeightsFormat f, const char *ours, long *N)
{
    for (int i = 0; i < f->n; i++)
        if (f->rows[i].how <= HF_TRANSPOSE && pat_match(f->rows[i].ours, ours, N)) return &f->rows[i];
    return NULL;
}

/* The row of format f for HF's tensor `hf`, also without the format's prefix. */
static const HfRow *row_of_hf(RtWeightsFormat f, const char *hf, long *N)
{
    char full[NAME];
    for (int pass = 0; pass < 2; pass++) {
        if (pass) snprintf(full, sizeof full, "%s%s", f->prefix, hf);
        for (int i = 0; i < f->n; i++)
            if (pat_match(f->rows[i].hf, pass ? full : hf, N)) return &f->rows[i];
        if (!f->prefix[0] || !strncmp(hf, f->prefix, strlen(f->prefix))) break;
    }
    return NULL;
}

const char *rt_hf_name(RtWeightsFormat f, const char *ours, char *buf, size_t n)
{
    long N;
    if (f == RT_WEIGHTS_FSEXEC) return snprintf(buf, n, "%s", ours), buf;
    const HfRow *r = row_of_ours(f, ours, &N);
    return r ? pat_fill(r->hf, N, buf, n) : NULL;
}

const char *rt_hf_unprefixed(RtWeightsFormat f, const char *hf)
{
    size_t pl = f ? strlen(f->prefix) : 0;
    return pl && !strncmp(hf, f->prefix, pl) ? hf + pl : NULL;
}

/* The file's tensor named hf, or the same without the format's prefix; NULL if neither. */
static const StTensor *file_tensor(const StFile *file, RtWeightsFormat f, const char *hf)
{
    size_t n = rt_st_count(file), pl = strlen(f->prefix);
    for (size_t j = 0; j < n; j++)
        if (!strcmp(rt_st_tensor(file, j)->name, hf)) return rt_st_tensor(file, j);
    for (size_t j = 0; pl && !strncmp(hf, f->prefix, pl) && j < n; j++)
        if (!strcmp(rt_st_tensor(file, j)->name, hf + pl)) return rt_st_tensor(file, j);
    return NULL;
}

/* "26 tensors: wte.weight, wpe.weight, ... " (the first few by position in the file). */
static char *file_names(const StFile *file, char *buf, size_t n)
{
    size_t count = rt_st_count(file);
    size_t at = (size_t)snprintf(buf, n, "%zu tensor%s%s", count, count == 1 ? "" : "s", count ? ": " : "");
    for (size_t j = 0; j < count && j < 5 && at < n; j++)
        at += (size_t)snprintf(buf + at, n - at, "%s%s", j ? ", " : "", rt_st_tensor(file, j)->name);
    if (count > 5 && at < n) snprintf(buf + at, n - at, ", ...");
    return buf;
}

/* ---- values ------------------------------------------------------------------------- */

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0x1f) u = sign | 0x7f800000u | man << 13;
    else if (exp) u = sign | (exp + 112) << 23 | man << 13;
    else if (!man) u = sign;
    else {  // subnormal: man * 2^-24, normalized
        uint32_t e = 113;
        while (!(man & 0x400u)) man <<= 1, e--;
        u = sign | e << 23 | (man & 0x3ffu) << 13;
    }
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* Elements [first, first + n) of a tensor of dtype dt at p, as f32 (exact for every
 * float dtype). */
static void to_f32(const uint8_t *p, PlanDType dt, int64_t first, int64_t n, float *out)
{
    if (dt == PLAN_DT_F32) {
        memcpy(out, p + 4 * first, sizeof(float) * (size_t)n);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * (first + i), 2);
        if (dt == PLAN_DT_F16) out[i] = half_to_float(h);
        else {
            uint32_t u = (uint32_t)h << 16;
            memcpy(&out[i], &u, 4);
        }
    }
}

static int64_t numel(int rank, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < rank; d++) n *= shape[d];
    return n;
}

/* HF's tensor (dtype dt at p) into our f32 layout at dst; block: room for BLOCK rows. */
static void read_into(const uint8_t *p, PlanDType dt, const StEntry *t, HfHow how, float *block, float *dst)
{
    int64_t n = numel(t->rank, t->shape);
    if (how != HF_TRANSPOSE) {
        to_f32(p, dt, 0, n, dst);
        return;
    }
    int64_t I = t->shape[0], O = t->shape[1];  // ours [I, O] = HF's [O, I] transposed
    for (int64_t o0 = 0; o0 < O; o0 += BLOCK) {
        int64_t rows = O - o0 < BLOCK ? O - o0 : BLOCK;
        to_f32(p, dt, o0 * I, rows * I, block);
        for (int64_t i = 0; i < I; i++)
            for (int64_t r = 0; r < rows; r++) dst[i * O + o0 + r] = block[r * I + i];
    }
}

/* ---- reading ------------------------------------------------------------------------ */

/* "the hf-gpt2 mapping", "the map my.json", for messages. */
static const char *table_of(RtWeightsFormat f, char *buf, size_t n)
{
    snprintf(buf, n, f->user ? "the map %s" : "the %s mapping", f->user ? f->name + 4 : f->name);
    return buf;
}

/* File tensor fe for our t against the shape row r's layout needs. */
static int check_shape(RtWeightsFormat f, const StTensor *fe, const StEntry *t, const HfRow *r, char *err,
                       size_t errlen)
{
    int64_t want[PLAN_MAX_RANK];
    char a[128], b[128], c[128], tab[NAME];
    HfHow how = r->how;
    if (how == HF_TRANSPOSE && t->rank != 2)
        return plan_fail(err, errlen, "our '%s' has rank %d; %s transposes it (a matrix)", t->name, t->rank,
                         table_of(f, tab, sizeof tab));
    for (int d = 0; d < t->rank; d++) want[d] = how == HF_TRANSPOSE ? t->shape[t->rank - 1 - d] : t->shape[d];
    if (fe->dtype == PLAN_DT_I32)
        return plan_fail(err, errlen, "tensor '%s' is I32; a param is F32, F16 or BF16", fe->name);
    int same = fe->rank == t->rank, flipped = fe->rank == 2 && t->rank == 2;
    for (int d = 0; d < t->rank && same; d++) same = fe->shape[d] == want[d];
    if (same) return 0;
    flipped = flipped && fe->shape[0] == want[1] && fe->shape[1] == want[0];
    rt_st_shape_str(fe->dtype, fe->rank, fe->shape, a, sizeof a);
    rt_st_shape_str(PLAN_DT_COUNT, t->rank, want, b, sizeof b);
    rt_st_shape_str(PLAN_DT_COUNT, t->rank, t->shape, c, sizeof c);
    if (flipped)
        return plan_fail(err, errlen, "tensor '%s' is %s: %s needs %s (%s) for our '%s' %s; this file holds the "
                         "transpose%s", fe->name, a, f->name, b, f->layout[0] ? f->layout : how == HF_TRANSPOSE ?
                         "transposed into our [in, out]" : "our layout, as it is", t->name, c, f->flipped);
    return plan_fail(err, errlen, "tensor '%s' is %s in the file, but our '%s' %s needs %s: a file of another model "
                     "(other dims%s), or not a %s file", fe->name, a, t->name, c, b, r->if_shape,
                     f->model[0] ? f->model : f->name);
}

typedef struct {
    const StTensor *fe;  // where t[i] comes from
    const HfRow *row;
} Source;

/* Each t[i]'s tensor in the file, checked (src[i]). */
static int find_sources(const StFile *file, RtWeightsFormat f, const StEntry *t, int32_t n, Source *src, char *err,
                        size_t errlen)
{
    char hf[NAME], names[1024], tab[NAME];
    for (int32_t i = 0; i < n; i++) {
        long N;
        const HfRow *r = row_of_ours(f, t[i].name, &N);
        if (!r)
            return plan_fail(err, errlen, "our param '%s' has no row in %s (README: Hugging Face weights%s%s)",
                             t[i].name, table_of(f, tab, sizeof tab), f->covers[0] ? "; it covers " : "", f->covers);
        if (t[i].dtype != PLAN_DT_F32)
            return plan_fail(err, errlen, "our param '%s' is not f32 in this plan", t[i].name);
        pat_fill(r->hf, N, hf, sizeof hf);
        if (!(src[i].fe = file_tensor(file, f, hf)))
            return plan_fail(err, errlen, "no tensor '%s' (our '%s') in the file%s; it has %s", hf, t[i].name,
                             r->if_missing, file_names(file, names, sizeof names));
        src[i].row = r;
        if (check_shape(f, src[i].fe, &t[i], r, err, errlen)) return -1;
    }
    return 0;
}

static int known(const char *name, const StEntry *t, int32_t n, const char *const *also, int32_t n_also)
{
    for (int32_t i = 0; i < n; i++)
        if (!strcmp(t[i].name, name)) return 1;
    for (int32_t i = 0; i < n_also; i++)
        if (!strcmp(also[i], name)) return 1;
    return 0;
}

/* Whether pattern pat ({N}: a block index) is some name of t or `also`. */
static int names_some(const char *pat, const StEntry *t, int32_t n, const char *const *also, int32_t n_also)
{
    long N;
    for (int32_t i = 0; i < n; i++)
        if (pat_match(pat, t[i].name, &N)) return 1;
    for (int32_t i = 0; i < n_also; i++)
        if (pat_match(pat, also[i], &N)) return 1;
    return 0;
}

/* A user's table: every row but a buffer's or an optional one names a param of the
 * model (t, and other stages' in `also`). */
static int check_user_rows(RtWeightsFormat f, const StEntry *t, int32_t n, const char *const *also, int32_t n_also,
                           char *err, size_t errlen)
{
    char some[512];
    for (int i = 0; f->user && i < f->n; i++) {
        const HfRow *r = &f->rows[i];
        if (r->how == HF_BUFFER || r->optional || names_some(r->ours, t, n, also, n_also)) continue;
        size_t at = 0;
        for (int32_t j = 0; j < n && j < 6 && at < sizeof some; j++)
            at += (size_t)snprintf(some + at, sizeof some - at, "%s%s", j ? ", " : "", t[j].name);
        return plan_fail(err, errlen, "the map %s: tensors[%d] ('%s') names our '%s', which is no param of this "
                         "model (unknown name; its params: %s%s); fix the row, or mark it \"optional\": true",
                         f->name + 4, i, r->hf, r->ours, some, n > 6 ? ", ..." : "");
    }
    return 0;
}

/* Every tensor of the file has its place: a source of some t[i], another stage's param,
 * a tied copy, a buffer, or an optional row's param the model has not. */
static int check_rest(const StFile *file, RtWeightsFormat f, const StEntry *t, int32_t n, const Source *src,
                      const char *const *also, int32_t n_also, char *err, size_t errlen)
{
    char ours[NAME], tab[NAME];
    for (size_t j = 0; j < rt_st_count(file); j++) {
        const StTensor *fe = rt_st_tensor(file, j);
        long N;
        const HfRow *r = row_of_hf(f, fe->name, &N);
        if (!r)
            return plan_fail(err, errlen, "tensor '%s' of the file has no row in %s (README: Hugging Face "
                             "weights): a file of another architecture?", fe->name, table_of(f, tab, sizeof tab));
        if (r->how == HF_BUFFER || r->how == HF_TIED) continue;
        pat_fill(r->ours, N, ours, sizeof ours);
        if (!known(ours, t, n, also, n_also) && r->optional) continue;
        if (!known(ours, t, n, also, n_also))
            return plan_fail(err, errlen, "tensor '%s' of the file is our '%s', which the model has not (a file of "
                             "another model: more layers?)", fe->name, ours);
        for (int32_t i = 0; i < n; i++)
            if (!strcmp(t[i].name, ours) && src[i].fe != fe)
                return plan_fail(err, errlen, "the file holds our '%s' twice: '%s' and '%s'", ours, src[i].fe->name,
                                 fe->name);
    }
    return 0;
}

/* A tied copy in the file (GPT-2's lm_head.weight) against its source t[i]: the same
 * shape, and the same values once both are f32. */
static int check_tied(const StFile *file, const uint8_t *map, RtWeightsFormat f, const StEntry *t, int32_t n,
                      const Source *src, float *a, float *b, char *err, size_t errlen)
{
    char x[128], y[128];
    for (int k = 0; k < f->n; k++) {
        const HfRow *r = &f->rows[k];
        const StTensor *copy = r->how == HF_TIED ? file_tensor(file, f, r->hf) : NULL;
        for (int32_t i = 0; copy && i < n; i++) {
            const StTensor *fe = src[i].fe;
            if (strcmp(t[i].name, r->ours)) continue;
            int same = copy->rank == fe->rank;
            for (int d = 0; d < fe->rank && same; d++) same = copy->shape[d] == fe->shape[d];
            if (!same)
                return plan_fail(err, errlen, "tensor '%s' is %s but '%s' is %s; our model ties them (one param, '%s')",
                                 copy->name, rt_st_shape_str(copy->dtype, copy->rank, copy->shape, x, sizeof x), fe->name,
                                 rt_st_shape_str(fe->dtype, fe->rank, fe->shape, y, sizeof y), t[i].name);
            if (rt_st_check_finite(copy, map + copy->begin, err, errlen)) return -1;
            int64_t count = numel(fe->rank, fe->shape), step = BLOCK * 1024;
            for (int64_t at = 0; at < count; at += step) {
                int64_t m = count - at < step ? count - at : step;
                to_f32(map + fe->begin, fe->dtype, at, m, a);
                to_f32(map + copy->begin, copy->dtype, at, m, b);
                for (int64_t e = 0; e < m; e++)
                    if (a[e] != b[e])
                        return plan_fail(err, errlen, "tensor '%s' differs from '%s' (first at element %" PRId64
                                         ": %.9g against %.9g), but our model ties them (one param, '%s'): a model "
                                         "whose head is not its embedding does not fit this .fsm", copy->name,
                                         fe->name, at + e, (double)b[e], (double)a[e], t[i].name);
            }
        }
    }
    return 0;
}

static int read_file(const StFile *file, RtWeightsFormat f, const StEntry *t, int32_t n, const char *const *also,
                     int32_t n_also, char *err, size_t errlen)
{
    Source *src = plan_alloc(sizeof *src * ((size_t)n + 1));
    int64_t widest = BLOCK * 1024;  // the tied check's blocks; and BLOCK rows of the widest matrix
    for (int32_t i = 0; i < n; i++)
        if (t[i].rank == 2 && BLOCK * t[i].shape[0] > widest) widest = BLOCK * t[i].shape[0];
    float *a = plan_alloc(sizeof(float) * (size_t)widest), *b = plan_alloc(sizeof(float) * (size_t)widest);
    const uint8_t *map = NULL;
    int rc = !src || !a || !b ? plan_fail(err, errlen, "out of memory") : 0;
    if (!rc) rc = check_user_rows(f, t, n, also, n_also, err, errlen);
    if (!rc) rc = find_sources(file, f, t, n, src, err, errlen);
    if (!rc) rc = check_rest(file, f, t, n, src, also, n_also, err, errlen);
    if (!rc) rc = (map = rt_st_map(file, err, errlen)) ? 0 : -1;
    for (int32_t i = 0; i < n && !rc; i++) rc = rt_st_check_finite(src[i].fe, map + src[i].fe->begin, err, errlen);
    if (!rc) rc = check_tied(file, map, f, t, n, src, a, b, err, errlen);
    for (int32_t i = 0; i < n && !rc; i++)
        read_into(map + src[i].fe->begin, src[i].fe->dtype, &t[i], src[i].row->how, a, t[i].data);
    rt_st_unmap(file, map);
    plan_dealloc(a);
    plan_dealloc(b);
    plan_dealloc(src);
    return rc;
}

int rt_hf_read(const char *path, RtWeightsFormat f, const StEntry *t, int32_t n, const char *const *also,
               int32_t n_also, char *err, size_t errlen)
{
    char why[1536];
    StFile *file = rt_st_open(path, why, sizeof why);
    int rc = file ? read_file(file, f, t, n, also, n_also, why, sizeof why) : -1;
    rt_st_close(file);
    if (rc) plan_fail(err, errlen, "%s: %s", path, why);
    return rc;
}

/* ---- writing ------------------------------------------------------------------------ */

/* t's bytes in HF's layout, after the header; block: room for BLOCK rows. */
static void write_tensor(PlanOutput *o, const StEntry *t, HfHow how, float *block)
{
    const float *x = t->data;
    if (how != HF_TRANSPOSE) {
        plan_output_write(o, x, sizeof(float) * (size_t)numel(t->rank, t->shape));
        return;
    }
    int64_t I = t->shape[0], O = t->shape[1];  // HF's row o is our column o
    for (int64_t o0 = 0; o0 < O; o0 += BLOCK) {
        int64_t rows = O - o0 < BLOCK ? O - o0 : BLOCK;
        for (int64_t i = 0; i < I; i++)
            for (int64_t r = 0; r < rows; r++) block[r * I + i] = x[i * O + o0 + r];
        plan_output_write(o, block, sizeof(float) * (size_t)(rows * I));
    }
}

/* The HF entries of t (names in names, NAME bytes each; shapes in shapes) and each one's
 * row's layout in how. */
static int hf_entries(RtWeightsFormat f, const StEntry *t, int32_t n, StEntry *out, char *names, int64_t *shapes,
                      HfHow *how, char *err, size_t errlen)
{
    char tab[NAME];
    for (int32_t i = 0; i < n; i++) {
        long N;
        const HfRow *r = row_of_ours(f, t[i].name, &N);
        if (!r)
            return plan_fail(err, errlen, "our param '%s' has no row in %s (README: Hugging Face weights)",
                             t[i].name, table_of(f, tab, sizeof tab));
        if (t[i].dtype != PLAN_DT_F32) return plan_fail(err, errlen, "our param '%s' is not f32", t[i].name);
        if (r->how == HF_TRANSPOSE && t[i].rank != 2)
            return plan_fail(err, errlen, "our '%s' has rank %d; %s transposes it (a matrix)", t[i].name,
                             t[i].rank, table_of(f, tab, sizeof tab));
        int64_t *shape = shapes + (size_t)i * PLAN_MAX_RANK;
        for (int d = 0; d < t[i].rank; d++) shape[d] = r->how == HF_TRANSPOSE ? t[i].shape[1 - d] : t[i].shape[d];
        how[i] = r->how;
        out[i] = (StEntry){pat_fill(r->hf, N, names + (size_t)i * NAME, NAME), PLAN_DT_F32, t[i].rank, shape, NULL};
    }
    return 0;
}

int rt_hf_write(const char *path, RtWeightsFormat f, const StEntry *t, int32_t n, int64_t step, char *err,
                size_t errlen)
{
    size_t m = (size_t)n + 1;
    StEntry *h = plan_alloc(sizeof *h * m);
    char *names = plan_alloc(NAME * m), why[512], s[32];
    int64_t *shapes = plan_alloc(sizeof *shapes * PLAN_MAX_RANK * m), widest = 1;
    HfHow *how = plan_alloc(sizeof *how * m);
    for (int32_t i = 0; i < n; i++)
        if (t[i].rank == 2 && BLOCK * t[i].shape[0] > widest) widest = BLOCK * t[i].shape[0];
    float *block = plan_alloc(sizeof(float) * (size_t)widest);
    uint8_t *head = NULL;
    size_t hlen = 0;
    snprintf(s, sizeof s, "%" PRId64, step);
    const char *meta[] = {"step", s};
    int rc = !h || !names || !shapes || !how || !block ? plan_fail(err, errlen, "%s: out of memory", path) : 0;
    if (!rc && hf_entries(f, t, n, h, names, shapes, how, why, sizeof why))
        rc = plan_fail(err, errlen, "%s: %s", path, why);
    if (!rc && rt_st_header(h, n, meta, 1, &head, &hlen))
        rc = plan_fail(err, errlen, "%s: out of memory building the header", path);
    PlanOutput *o = rc ? NULL : plan_output_open(path, why, sizeof why);
    if (!rc && !o) rc = plan_fail(err, errlen, "%s: %s", path, why);
    if (o) {
        plan_output_write(o, head, hlen);
        for (int32_t i = 0; i < n; i++) write_tensor(o, &t[i], how[i], block);
        if (plan_output_commit(o, why, sizeof why)) rc = plan_fail(err, errlen, "%s: %s", path, why);
    }
    plan_dealloc(head);
    plan_dealloc(block);
    plan_dealloc(how);
    plan_dealloc(shapes);
    plan_dealloc(names);
    plan_dealloc(h);
    return rc;
}
