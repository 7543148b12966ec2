/* plan/read.c: bytes -> Plan, for a file nobody vouches for (Lua's lundump, with
 * checksums). First the frame, each check with its own message and before anything
 * is decoded: size, magic (and what damaged it), version, section table bounds, header
 * checksum, file size, each section's bounds and checksum, the required sections. Then
 * the sections are decoded, every count checked against the bytes that hold it (so no
 * allocation is larger than the file justifies), and plan_check vets every id and range.
 * Any failure frees what was built and returns NULL with the message; nothing aborts.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "format.h"
#include "plan.h"

typedef struct {
    const uint8_t *b;
    size_t len;
    char *err;
    size_t errlen;
    unsigned minor;  // the file's: 0 reads 2.0's records, with 2.1's fields at their defaults
    int nested;      // the plan of an EVAL or SAMP section, which has none of its own (so
                     // no file, however made, nests plans deeper than one)
} Reader;

__attribute__((format(printf, 2, 3))) static int fail(Reader *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    plan_vfail(r->err, r->errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static const char TAGS[SEC_COUNT][5] = {
#define X(id, tag, required) tag,
    PLAN_SECTIONS(X)
#undef X
};
static const int REQUIRED[SEC_COUNT] = {
#define X(id, tag, required) required,
    PLAN_SECTIONS(X)
#undef X
};

/* ---- the frame ---------------------------------------------------------------------- */

static int is_text(const uint8_t *b, size_t n)
{
    if (!n) return 0;
    for (size_t i = 0; i < n && i < 64; i++)
        if (b[i] < 0x20 ? !(b[i] == '\n' || b[i] == '\r' || b[i] == '\t') : b[i] == 0x7f) return 0;
    return 1;
}

static int starts(const uint8_t *b, size_t n, const char *s, size_t slen)
{
    return n >= slen && !memcmp(b, s, slen);
}

/* Why the first bytes are not the magic: the damage the PNG-style magic is made to show. */
static int bad_magic(Reader *r)
{
    const uint8_t *b = r->b;
    size_t n = r->len;
    const char *why = "";
    if (starts(b, n, "\x89" "FSP\n\x1a\n", 7))
        why = ": its line endings were converted from CRLF to LF (a text-mode transfer); copy it "
              "in binary mode";
    else if (starts(b, n, "\x89" "FSP\r\r\n", 7) || starts(b, n, "\x89" "FSP\r\n\x1a\r\n", 9))
        why = ": its line endings were converted from LF to CRLF (a text-mode transfer); copy it "
              "in binary mode";
    else if (starts(b, n, "\x09" "FSP", 4))
        why = ": its 8th bits were stripped (a 7-bit transfer); copy it in binary mode";
    else if (starts(b, n, "\x89" "FSP", 4) || (n >= 4 && !memcmp(b + 1, "FSP", 3)))
        why = ": the file's first bytes are damaged";
    else if (is_text(b, n))
        why = "; it looks like a text file (a model source? compile it with fsc first)";
    return fail(r, "not an fsc plan (bad magic)%s", why);
}

/* Checks everything before the sections' contents; sets the number of sections. */
static int check_frame(Reader *r, uint32_t *n_sections)
{
    const uint8_t *b = r->b;
    size_t len = r->len;
    size_t have = len < PLAN_MAGIC_LEN ? len : PLAN_MAGIC_LEN;
    if (have && memcmp(b, PLAN_MAGIC, have)) return bad_magic(r);
    if (len == 0) return fail(r, "truncated: the file is empty");
    if (len < PLAN_HEADER_SIZE)
        return fail(r, "truncated: the file has %zu bytes, less than the %d-byte plan header", len,
                    (int)PLAN_HEADER_SIZE);

    unsigned major = get_u16(b + 8), minor = get_u16(b + 10);
    if (major > PLAN_MAJOR)
        return fail(r, "plan version %u.%u is newer than this fsexec supports (%d.x); rebuild fsexec "
                    "or recompile the plan", major, minor, PLAN_MAJOR);
    if (major < PLAN_MAJOR)
        return fail(r, "plan version %u.%u is older than this fsexec supports (%d.x): it has one op list and "
                    "one arena, where version %d has programs, memory spaces and a compiled schedule; recompile "
                    "the plan with this fsc (fsc MODEL.fsm -o PLAN)", major, minor, PLAN_MAJOR, PLAN_MAJOR);

    uint32_t n = get_u32(b + 12);
    uint64_t size = get_u64(b + 16);
    uint64_t table_end = PLAN_HEADER_SIZE + (uint64_t)PLAN_ENTRY_SIZE * n;
    if (table_end > len) {
        if (size > len)
            return fail(r, "truncated: the file has %zu bytes, its header says %llu", len,
                        (unsigned long long)size);
        return fail(r, "header damaged: a table of %u sections does not fit in the file's %zu bytes",
                    n, len);
    }
    static const uint8_t zero[4];
    uint32_t crc = plan_crc32(0, b, PLAN_HEADER_CRC_AT);
    crc = plan_crc32(crc, zero, 4);
    crc = plan_crc32(crc, b + PLAN_HEADER_CRC_AT + 4, (size_t)table_end - PLAN_HEADER_CRC_AT - 4);
    if (crc != get_u32(b + PLAN_HEADER_CRC_AT)) return fail(r, "header checksum mismatch (file damaged)");
    if (size > len)
        return fail(r, "truncated: the file has %zu bytes, its header says %llu", len, (unsigned long long)size);
    if (size < len)
        return fail(r, "trailing bytes: the file has %zu bytes, its header says %llu (damaged, or "
                    "something was appended)", len, (unsigned long long)size);
    *n_sections = n;
    return 0;
}

/* Reads the table into p->sections, checks bounds, then checksums, and finds the
 * sections this version knows (at[SEC_x] = table index, or -1 for an optional one the
 * file lacks). */
static int check_sections(Reader *r, Plan *p, uint32_t n, int32_t at[SEC_COUNT])
{
    p->sections = plan_alloc(sizeof *p->sections * (n ? n : 1));
    if (!p->sections) return fail(r, "out of memory reading the section table");
    uint64_t pos = PLAN_HEADER_SIZE + (uint64_t)PLAN_ENTRY_SIZE * n;
    for (int s = 0; s < SEC_COUNT; s++) at[s] = -1;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *e = r->b + PLAN_HEADER_SIZE + (size_t)PLAN_ENTRY_SIZE * i;
        PlanSection *s = &p->sections[p->n_sections++];
        for (int k = 0; k < 4; k++) s->tag[k] = e[k] >= 0x20 && e[k] < 0x7f ? (char)e[k] : '?';
        s->tag[4] = 0;
        s->crc = get_u32(e + 4);
        s->offset = get_u64(e + 8);
        s->length = get_u64(e + 16);
        if (s->offset > r->len || s->length > r->len - s->offset)
            return fail(r, "section %s: out of bounds (offset %llu, length %llu, in a %zu-byte file)",
                        s->tag, (unsigned long long)s->offset, (unsigned long long)s->length, r->len);
        if (s->offset != pos)
            return fail(r, "section %s: starts at byte %llu, expected %llu (sections follow each other "
                        "without gaps)", s->tag, (unsigned long long)s->offset, (unsigned long long)pos);
        pos = s->offset + s->length;
        for (int k = 0; k < SEC_COUNT; k++)
            if (!memcmp(e, TAGS[k], 4)) {
                if (at[k] >= 0) return fail(r, "section %s appears twice", s->tag);
                at[k] = (int32_t)i;
            }
    }
    if (pos != r->len)
        return fail(r, "the sections end at byte %llu, but the file has %zu bytes", (unsigned long long)pos, r->len);
    for (int32_t i = 0; i < p->n_sections; i++) {
        const PlanSection *s = &p->sections[i];
        if (plan_crc32(0, r->b + s->offset, (size_t)s->length) != s->crc)
            return fail(r, "section %s: checksum mismatch (file damaged)", s->tag);
    }
    for (int k = 0; k < SEC_COUNT; k++)
        if (at[k] < 0 && REQUIRED[k]) return fail(r, "missing section %s (not a complete plan)", TAGS[k]);
    return 0;
}

/* ---- the sections --------------------------------------------------------------------- */

/* One known section's bytes. */
typedef struct {
    const uint8_t *b;
    size_t len;
    const char *tag;
} Sec;

/* An array of count items of `elem` bytes each in memory, for a section that holds
 * count * `rec` bytes after a `head`-byte header; NULL with a message otherwise. */
static void *alloc_items(Reader *r, const Sec *s, uint32_t count, uint64_t rec, size_t head, size_t elem)
{
    if (s->len < head) return fail(r, "section %s: too short (%zu bytes)", s->tag, s->len), NULL;
    if (count > INT32_MAX || (uint64_t)count * rec != s->len - head) {
        fail(r, "section %s: %u items of %llu bytes do not fill its %zu bytes", s->tag, count,
             (unsigned long long)rec, s->len);
        return NULL;
    }
    void *a = plan_alloc(elem * (count ? count : 1));
    if (!a) fail(r, "out of memory reading section %s (%u items)", s->tag, count);
    return a;
}

/* The header of a section of records: its count, and its record size, which must be at
 * least what this version writes (a newer minor may write more; the rest is skipped). */
static void *alloc_records(Reader *r, const Sec *s, uint32_t min_rec, size_t elem, uint32_t *count, uint32_t *rec)
{
    if (s->len < 8) return fail(r, "section %s: too short (%zu bytes)", s->tag, s->len), NULL;
    *count = get_u32(s->b);
    *rec = get_u32(s->b + 4);
    if (*rec < min_rec) {
        fail(r, "section %s: records of %u bytes, expected at least %u", s->tag, *rec, min_rec);
        return NULL;
    }
    return alloc_items(r, s, *count, *rec, 8, elem);
}

static int read_strs(Reader *r, const Sec *s, Plan *p)
{
    if (s->len < 4) return fail(r, "section STRS: too short (%zu bytes)", s->len);
    uint32_t count = get_u32(s->b);
    /* Each string takes at least its 4-byte length. */
    if (count > (s->len - 4) / 4 || count > INT32_MAX)
        return fail(r, "section STRS: %u strings cannot fit in %zu bytes", count, s->len);
    p->strs = plan_alloc(sizeof *p->strs * (count ? count : 1));
    if (!p->strs) return fail(r, "out of memory reading section STRS (%u strings)", count);
    size_t at = 4;
    for (uint32_t i = 0; i < count; i++) {
        if (s->len - at < 4) return fail(r, "section STRS: string %u runs past the section's end", i);
        uint32_t n = get_u32(s->b + at);
        at += 4;
        if (n > s->len - at) return fail(r, "section STRS: string %u runs past the section's end", i);
        if (memchr(s->b + at, 0, n)) return fail(r, "section STRS: string %u holds a NUL byte", i);
        char *str = plan_alloc((size_t)n + 1);
        if (!str) return fail(r, "out of memory reading section STRS");
        memcpy(str, s->b + at, n);
        str[n] = 0;
        p->strs[p->n_strs++] = str;
        at += n;
    }
    if (at != s->len) return fail(r, "section STRS: %zu bytes left after the last string", s->len - at);
    return 0;
}

static int32_t get_i32(const uint8_t *b) { return (int32_t)get_u32(b); }

static int read_meta(Reader *r, const Sec *s, Plan *p)
{
    uint32_t n, rec;
    if (!(p->meta = alloc_records(r, s, REC_META, sizeof *p->meta, &n, &rec))) return -1;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *b = s->b + 8 + (size_t)i * rec;
        PlanMeta *m = &p->meta[p->n_meta++];
        uint64_t v = get_u64(b + 8);
        *m = (PlanMeta){.key = get_i32(b), .kind = (PlanMetaKind)b[4], .s = PLAN_NONE};
        if (m->kind == PLAN_META_STR) m->s = (int32_t)(uint32_t)v;
        if (m->kind == PLAN_META_INT) m->i = (int64_t)v;
        if (m->kind == PLAN_META_FLOAT) m->f = bits_f64(v);
    }
    return 0;
}

static int read_blocks(Reader *r, const Sec *s, Plan *p)
{
    uint32_t n, rec;
    if (!(p->blocks = alloc_records(r, s, REC_BLKS, sizeof *p->blocks, &n, &rec))) return -1;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *b = s->b + 8 + (size_t)i * rec;
        p->blocks[p->n_blocks++] = (PlanBlock){get_i32(b), get_i32(b + 4), get_i32(b + 8)};
    }
    return 0;
}

static int read_tensors(Reader *r, const Sec *s, Plan *p)
{
    uint32_t n, rec;
    if (!(p->tensors = alloc_records(r, s, r->minor >= 2 ? REC_TENS : REC_TENS_2_1, sizeof *p->tensors, &n, &rec)))
        return -1;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *b = s->b + 8 + (size_t)i * rec;
        PlanTensor *t = &p->tensors[p->n_tensors++];
        *t = (PlanTensor){
            .name = get_i32(b), .dtype = (PlanDType)b[4], .role = (PlanRole)b[5],
            .place = (PlanPlace)b[6], .init = (PlanInit)b[7], .rank = b[8],
            .block = get_i32(b + 12), .producer = get_i32(b + 16), .tied_to = get_i32(b + 20),
            .init_a = bits_f64(get_u64(b + 24)), .init_b = bits_f64(get_u64(b + 32)),
            .grad = get_i32(b + 88), .live_start = get_i32(b + 92), .live_end = get_i32(b + 96),
            .alias = get_i32(b + 100), .offset = (int64_t)get_u64(b + 104),
            .rank_stride = (int64_t)get_u64(b + 112), .flat_offset = (int64_t)get_u64(b + 120),
            .unit = get_i32(b + 128), .sharded = b[132], .step_role = (PlanStepRole)b[133],
        };
        for (int d = 0; d < t->rank && d < PLAN_MAX_RANK; d++) t->shape[d] = (int64_t)get_u64(b + 40 + 8 * d);
        if (rec >= REC_TENS) t->logical_rows = (int64_t)get_u64(b + 136);
    }
    return 0;
}

static int read_ops(Reader *r, const Sec *s, Plan *p)
{
    uint32_t n, rec;
    if (!(p->ops = alloc_records(r, s, r->minor ? REC_NODE : REC_NODE_2_0, sizeof *p->ops, &n, &rec))) return -1;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *b = s->b + 8 + (size_t)i * rec;
        PlanOp *o = &p->ops[p->n_ops++];
        *o = (PlanOp){
            .op = get_i32(b), .block = get_i32(b + 4), .phase = (PlanPhase)b[8],
            .line = get_i32(b + 12), .col = get_i32(b + 16), .in = get_i32(b + 20),
            .n_in = get_i32(b + 24), .out = get_i32(b + 28), .n_out = get_i32(b + 32),
            .attr = get_i32(b + 36), .n_attr = get_i32(b + 40), .stream = (PlanStream)b[9],
            .wait = get_i32(b + 44), .n_wait = get_i32(b + 48), .microbatch = PLAN_NONE,
        };
        if (r->minor) o->microbatch = get_i32(b + 52), o->flops = bits_f64(get_u64(b + 56));
    }
    return 0;
}

static int read_attrs(Reader *r, const Sec *s, Plan *p)
{
    uint32_t n, rec;
    if (!(p->attrs = alloc_records(r, s, REC_ATTR, sizeof *p->attrs, &n, &rec))) return -1;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *b = s->b + 8 + (size_t)i * rec;
        PlanAttr *a = &p->attrs[p->n_attrs++];
        uint64_t v = get_u64(b + 8);
        *a = (PlanAttr){.key = get_i32(b), .kind = (PlanAttrKind)b[4]};
        if (a->kind == PLAN_ATTR_INT) a->i = (int64_t)v;
        if (a->kind == PLAN_ATTR_FLOAT) a->f = bits_f64(v);
        if (a->kind == PLAN_ATTR_INTS) a->list = get_i32(b + 8), a->n_list = get_i32(b + 12);
    }
    return 0;
}

/* IDS, OUTS and WAIT: a count, then that many i32. */
static int read_i32s(Reader *r, const Sec *s, int32_t **out, int32_t *n_out)
{
    if (s->len < 4) return fail(r, "section %s: too short (%zu bytes)", s->tag, s->len);
    uint32_t n = get_u32(s->b);
    if (!(*out = alloc_items(r, s, n, 4, 4, sizeof **out))) return -1;
    for (uint32_t i = 0; i < n; i++) (*out)[i] = get_i32(s->b + 4 + 4 * (size_t)i);
    *n_out = (int32_t)n;
    return 0;
}

static int read_ints(Reader *r, const Sec *s, Plan *p)
{
    if (s->len < 4) return fail(r, "section INTS: too short (%zu bytes)", s->len);
    uint32_t n = get_u32(s->b);
    if (!(p->ints = alloc_items(r, s, n, 8, 4, sizeof *p->ints))) return -1;
    for (uint32_t i = 0; i < n; i++) p->ints[i] = (int64_t)get_u64(s->b + 4 + 8 * (size_t)i);
    p->n_ints = (int32_t)n;
    return 0;
}

/* A 2.0 file's programs get their ranges once every section is read (see whole_ranges). */
static int read_programs(Reader *r, const Sec *s, Plan *p)
{
    uint32_t n, rec;
    if (!(p->programs = alloc_records(r, s, r->minor ? REC_PROG : REC_PROG_2_0, sizeof *p->programs, &n, &rec)))
        return -1;
    if (!r->minor && n > 1)
        return fail(r, "section PROG: %u programs in a version 2.0 plan, which has at most one (recompile the plan)", n);
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *b = s->b + 8 + (size_t)i * rec;
        PlanProgram *g = &p->programs[p->n_programs++];
        *g = (PlanProgram){.stage = get_i32(b), .dp_world = get_i32(b + 4), .first_op = get_i32(b + 8),
                           .n_ops = get_i32(b + 12)};
        for (int k = 0; k < PLAN_PLACE_COUNT; k++) g->space_bytes[k] = (int64_t)get_u64(b + 16 + 8 * k);
        if (!r->minor) continue;
        g->first_tensor = get_i32(b + 32), g->n_tensors = get_i32(b + 36);
        g->first_output = get_i32(b + 40), g->n_outputs = get_i32(b + 44);
        g->module_at = (int64_t)get_u64(b + 48), g->module_len = (int64_t)get_u64(b + 56);
    }
    return 0;
}

/* Version 2.0's one program holds every tensor, every output and the whole module. */
static void whole_ranges(Plan *p)
{
    if (!p->n_programs) return;
    PlanProgram *g = &p->programs[0];
    g->first_tensor = 0, g->n_tensors = p->n_tensors;
    g->first_output = 0, g->n_outputs = p->n_outputs;
    g->module_at = 0, g->module_len = p->cuda_module ? (int64_t)strlen(p->cuda_module) : 0;
}

/* CUMD: the CUDA module's text, NUL-terminated in memory. */
static int read_module(Reader *r, const Sec *s, Plan *p)
{
    if (s->len < 4) return fail(r, "section CUMD: too short (%zu bytes)", s->len);
    uint32_t n = get_u32(s->b);
    if (n != s->len - 4) return fail(r, "section CUMD: a text of %u bytes does not fill its %zu bytes", n, s->len);
    if (!n) return 0;
    if (memchr(s->b + 4, 0, n)) return fail(r, "section CUMD: the CUDA module holds a NUL byte");
    if (!(p->cuda_module = plan_alloc((size_t)n + 1))) return fail(r, "out of memory reading section CUMD");
    memcpy(p->cuda_module, s->b + 4, n);
    p->cuda_module[n] = 0;
    return 0;
}

/* CUDA: the CUDA program's instructions. */
static int read_cuda(Reader *r, const Sec *s, Plan *p)
{
    uint32_t n, rec;
    if (!(p->cuda = alloc_records(r, s, REC_CUDA, sizeof *p->cuda, &n, &rec))) return -1;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *b = s->b + 8 + (size_t)i * rec;
        PlanCuda *c = &p->cuda[p->n_cuda++];
        *c = (PlanCuda){
            .op = get_i32(b), .kind = (PlanCuKind)b[4], .epilogue = b[5], .beta = b[6], .kernel = get_i32(b + 8),
            .args = get_i32(b + 12),
            .n_args = get_i32(b + 16), .smem = get_i32(b + 44), .ta = get_i32(b + 48), .tb = get_i32(b + 52),
        };
        for (int d = 0; d < 3; d++) c->grid[d] = get_i32(b + 20 + 4 * d), c->block[d] = get_i32(b + 32 + 4 * d);
        int64_t *i64s[] = {&c->m, &c->n, &c->k, &c->lda, &c->ldb, &c->ldc, &c->stride_a, &c->stride_b,
                           &c->stride_c, &c->batch, &c->a_off, &c->b_off, &c->c_off};
        for (int k = 0; k < 13; k++) *i64s[k] = (int64_t)get_u64(b + 56 + 8 * k);
    }
    return 0;
}

static Plan *read_mem(const void *buf, size_t len, int nested, char *err, size_t errlen);

/* EVAL, SAMP, DECO: a whole plan of `programs` programs (the evaluation: the training's
 * stages; the sampling and decode programs: one), read with every check of its own. */
static int read_subplan(Reader *r, const Sec *s, Plan **out, const char *what, int32_t programs)
{
    char why[400];
    if (r->nested) return fail(r, "section %s in the plan of another section: programs nest one deep", s->tag);
    *out = read_mem(s->b, s->len, 1, why, sizeof why);
    if (!*out) return fail(r, "section %s (%s): %s", s->tag, what, why);
    if ((*out)->n_programs != programs)
        return fail(r, "section %s (%s): a plan of %d programs, expected %d", s->tag, what, (*out)->n_programs,
                    programs);
    return 0;
}

static int decode(Reader *r, Plan *p, const int32_t at[SEC_COUNT])
{
    Sec s[SEC_COUNT];
    for (int k = 0; k < SEC_COUNT; k++) {
        const PlanSection *e = at[k] >= 0 ? &p->sections[at[k]] : NULL;
        s[k] = (Sec){e ? r->b + e->offset : NULL, e ? (size_t)e->length : 0, TAGS[k]};
    }
    if (read_strs(r, &s[SEC_STRS], p) || read_meta(r, &s[SEC_META], p) ||
        read_blocks(r, &s[SEC_BLKS], p) || read_tensors(r, &s[SEC_TENS], p) ||
        read_ops(r, &s[SEC_NODE], p) || read_i32s(r, &s[SEC_IDS], &p->ids, &p->n_ids) ||
        read_attrs(r, &s[SEC_ATTR], p) || read_ints(r, &s[SEC_INTS], p) ||
        read_i32s(r, &s[SEC_OUTS], &p->outputs, &p->n_outputs) ||
        read_i32s(r, &s[SEC_WAIT], &p->waits, &p->n_waits) || read_programs(r, &s[SEC_PROG], p) || (at[SEC_CUDA] >= 0 && read_cuda(r, &s[SEC_CUDA], p)) ||
        (at[SEC_CUMD] >= 0 && read_module(r, &s[SEC_CUMD], p)))
        return -1;
    if (!r->minor) whole_ranges(p);
    char why[200];
    if (plan_check(p, why, sizeof why)) return fail(r, "invalid plan: %s", why);
    if ((at[SEC_EVAL] >= 0 && read_subplan(r, &s[SEC_EVAL], &p->eval, "the evaluation program", p->n_programs)) ||
        (at[SEC_SAMP] >= 0 && read_subplan(r, &s[SEC_SAMP], &p->sample, "the sampling program", 1)) ||
        (at[SEC_DECO] >= 0 && read_subplan(r, &s[SEC_DECO], &p->decode, "the decode program", 1)))
        return -1;
    return 0;
}

Plan *plan_read_mem(const void *buf, size_t len, char *err, size_t errlen) { return read_mem(buf, len, 0, err, errlen); }

static Plan *read_mem(const void *buf, size_t len, int nested, char *err, size_t errlen)
{
    Reader r = {buf, len, err, errlen, 0, nested};
    uint32_t n = 0;
    int32_t at[SEC_COUNT];
    if (check_frame(&r, &n)) return NULL;
    Plan *p = plan_new();
    if (!p) {
        fail(&r, "out of memory");
        return NULL;
    }
    p->major = get_u16(r.b + 8);
    p->minor = get_u16(r.b + 10);
    r.minor = p->minor;
    if (check_sections(&r, p, n, at) || decode(&r, p, at)) {
        plan_free(p);
        return NULL;
    }
    return p;
}

/* ---- from a file ------------------------------------------------------------------------ */

Plan *plan_read(const char *path, char *err, size_t errlen)
{
    int64_t size;
    int fd = plan_open_input(path, &size, err, errlen);
    if (fd < 0) return NULL;
    if ((uint64_t)size > SIZE_MAX / 2) {
        snprintf(err, errlen, "too large to be a plan (%lld bytes)", (long long)size);
        close(fd);
        return NULL;
    }
    size_t len = (size_t)size, got = 0;
    uint8_t *buf = plan_alloc(len);
    if (!buf) {
        snprintf(err, errlen, "out of memory reading %zu bytes", len);
        close(fd);
        return NULL;
    }
    while (got < len) {
        ssize_t k = read(fd, buf + got, len - got);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            snprintf(err, errlen, "read error: %s", strerror(errno));
            plan_dealloc(buf);
            close(fd);
            return NULL;
        }
        if (k == 0) break;  // shrank while we read: the checks below call it truncated
        got += (size_t)k;
    }
    close(fd);
    Plan *p = plan_read_mem(buf, got, err, errlen);
    plan_dealloc(buf);
    return p;
}
