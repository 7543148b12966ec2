/* plan/write.c: Plan -> bytes -> file. The layout is in plan.h (header) and format.h
 * (sections). A plan is checked (plan_check) before it is encoded, so fsc never writes
 * a file fsexec would refuse; the file appears under its name only once it is complete
 * and on disk (temporary file, fsync, rename), so a crash or a full disk never leaves a
 * half-written plan where a good one was.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format.h"
#include "plan.h"

static const char TAGS[SEC_COUNT][5] = {
#define X(id, tag, required) tag,
    PLAN_SECTIONS(X)
#undef X
};

/* Bytes of each section, or 0 when the plan is too large for the format. */
static uint64_t section_size(const Plan *p, int s)
{
    switch ((SectionId)s) {
    case SEC_STRS: {
        uint64_t n = 4;
        for (int32_t i = 0; i < p->n_strs; i++) {
            size_t len = strlen(p->strs[i]);
            if (len > UINT32_MAX) return 0;
            n += 4 + (uint64_t)len;
        }
        return n;
    }
    case SEC_META: return 8 + (uint64_t)p->n_meta * REC_META;
    case SEC_BLKS: return 8 + (uint64_t)p->n_blocks * REC_BLKS;
    case SEC_TENS: return 8 + (uint64_t)p->n_tensors * REC_TENS;
    case SEC_NODE: return 8 + (uint64_t)p->n_ops * REC_NODE;
    case SEC_IDS: return 4 + (uint64_t)p->n_ids * 4;
    case SEC_ATTR: return 8 + (uint64_t)p->n_attrs * REC_ATTR;
    case SEC_INTS: return 4 + (uint64_t)p->n_ints * 8;
    case SEC_OUTS: return 4 + (uint64_t)p->n_outputs * 4;
    case SEC_CUDA: return 8 + (uint64_t)p->n_cuda * REC_CUDA;
    case SEC_WAIT: return 4 + (uint64_t)p->n_waits * 4;
    case SEC_PROG: return 8 + (uint64_t)p->n_programs * REC_PROG;
    case SEC_EVAL:
    case SEC_SAMP:
    case SEC_DECO: break;  // whole plans of their own (encode_all)
    case SEC_CUMD: {
        size_t len = p->cuda_module ? strlen(p->cuda_module) : 0;
        return len > UINT32_MAX ? 0 : 4 + (uint64_t)len;
    }
    case SEC_COUNT: break;
    }
    return 0;
}

/* Writes count and record size; returns where the first record goes. */
static uint8_t *records(uint8_t *w, int32_t count, uint32_t size)
{
    put_u32(w, (uint32_t)count);
    put_u32(w + 4, size);
    return w + 8;
}

static void put_i32(uint8_t *w, int32_t v) { put_u32(w, (uint32_t)v); }

static void encode_tensor(uint8_t *w, const PlanTensor *t)
{
    memset(w, 0, REC_TENS);
    put_i32(w, t->name);
    w[4] = (uint8_t)t->dtype, w[5] = (uint8_t)t->role, w[6] = (uint8_t)t->place;
    w[7] = (uint8_t)t->init, w[8] = (uint8_t)t->rank;
    put_i32(w + 12, t->block);
    put_i32(w + 16, t->producer);
    put_i32(w + 20, t->tied_to);
    put_u64(w + 24, f64_bits(t->init_a));
    put_u64(w + 32, f64_bits(t->init_b));
    for (int i = 0; i < PLAN_MAX_RANK; i++) put_u64(w + 40 + 8 * i, (uint64_t)(i < t->rank ? t->shape[i] : 0));
    put_i32(w + 88, t->grad);
    put_i32(w + 92, t->live_start);
    put_i32(w + 96, t->live_end);
    put_i32(w + 100, t->alias);
    put_u64(w + 104, (uint64_t)t->offset);
    put_u64(w + 112, (uint64_t)t->rank_stride);
    put_u64(w + 120, (uint64_t)t->flat_offset);
    put_i32(w + 128, t->unit);
    w[132] = t->sharded;
    w[133] = (uint8_t)t->step_role;
    put_u64(w + 136, (uint64_t)t->logical_rows);
}

static void encode_op(uint8_t *w, const PlanOp *o)
{
    memset(w, 0, REC_NODE);
    put_i32(w, o->op);
    put_i32(w + 4, o->block);
    w[8] = (uint8_t)o->phase;
    w[9] = (uint8_t)o->stream;
    const int32_t rest[] = {o->line,   o->col,    o->in,   o->n_in,   o->out,       o->n_out,
                            o->attr,   o->n_attr, o->wait, o->n_wait, o->microbatch};
    for (int i = 0; i < 11; i++) put_i32(w + 12 + 4 * i, rest[i]);
    put_u64(w + 56, f64_bits(o->flops));
}

static void encode_cuda(uint8_t *w, const PlanCuda *c)
{
    memset(w, 0, REC_CUDA);
    put_i32(w, c->op);
    w[4] = (uint8_t)c->kind;
    w[5] = (uint8_t)c->epilogue;
    w[6] = (uint8_t)c->beta;
    const int32_t i32s[] = {c->kernel, c->args, c->n_args, c->grid[0], c->grid[1], c->grid[2], c->block[0],
                            c->block[1], c->block[2], c->smem, c->ta, c->tb};
    for (int i = 0; i < 12; i++) put_i32(w + 8 + 4 * i, i32s[i]);
    const int64_t i64s[] = {c->m, c->n, c->k, c->lda, c->ldb, c->ldc, c->stride_a, c->stride_b, c->stride_c,
                            c->batch, c->a_off, c->b_off, c->c_off};
    for (int i = 0; i < 13; i++) put_u64(w + 56 + 8 * i, (uint64_t)i64s[i]);
}

/* key, kind, then an 8-byte value: the shape of META and ATTR records. */
static void encode_kv(uint8_t *w, int32_t key, int kind, uint64_t value)
{
    memset(w, 0, 16);
    put_i32(w, key);
    w[4] = (uint8_t)kind;
    put_u64(w + 8, value);
}

static void encode(const Plan *p, int s, uint8_t *w)
{
    switch ((SectionId)s) {
    case SEC_STRS:
        put_u32(w, (uint32_t)p->n_strs);
        w += 4;
        for (int32_t i = 0; i < p->n_strs; i++) {
            size_t len = strlen(p->strs[i]);
            put_u32(w, (uint32_t)len);
            memcpy(w + 4, p->strs[i], len);
            w += 4 + len;
        }
        break;
    case SEC_META:
        w = records(w, p->n_meta, REC_META);
        for (int32_t i = 0; i < p->n_meta; i++, w += REC_META) {
            const PlanMeta *m = &p->meta[i];
            uint64_t v = m->kind == PLAN_META_STR ? (uint32_t)m->s
                         : m->kind == PLAN_META_INT ? (uint64_t)m->i : f64_bits(m->f);
            encode_kv(w, m->key, m->kind, v);
        }
        break;
    case SEC_BLKS:
        w = records(w, p->n_blocks, REC_BLKS);
        for (int32_t i = 0; i < p->n_blocks; i++, w += REC_BLKS) {
            put_i32(w, p->blocks[i].name);
            put_i32(w + 4, p->blocks[i].layer);
            put_i32(w + 8, p->blocks[i].index);
        }
        break;
    case SEC_TENS:
        w = records(w, p->n_tensors, REC_TENS);
        for (int32_t i = 0; i < p->n_tensors; i++, w += REC_TENS) encode_tensor(w, &p->tensors[i]);
        break;
    case SEC_NODE:
        w = records(w, p->n_ops, REC_NODE);
        for (int32_t i = 0; i < p->n_ops; i++, w += REC_NODE) encode_op(w, &p->ops[i]);
        break;
    case SEC_IDS:
        put_u32(w, (uint32_t)p->n_ids);
        for (int32_t i = 0; i < p->n_ids; i++) put_i32(w + 4 + 4 * (size_t)i, p->ids[i]);
        break;
    case SEC_ATTR:
        w = records(w, p->n_attrs, REC_ATTR);
        for (int32_t i = 0; i < p->n_attrs; i++, w += REC_ATTR) {
            const PlanAttr *a = &p->attrs[i];
            uint64_t v = a->kind == PLAN_ATTR_INT ? (uint64_t)a->i
                         : a->kind == PLAN_ATTR_FLOAT ? f64_bits(a->f)
                         : (uint32_t)a->list | (uint64_t)(uint32_t)a->n_list << 32;
            encode_kv(w, a->key, a->kind, v);
        }
        break;
    case SEC_INTS:
        put_u32(w, (uint32_t)p->n_ints);
        for (int32_t i = 0; i < p->n_ints; i++) put_u64(w + 4 + 8 * (size_t)i, (uint64_t)p->ints[i]);
        break;
    case SEC_OUTS:
        put_u32(w, (uint32_t)p->n_outputs);
        for (int32_t i = 0; i < p->n_outputs; i++) put_i32(w + 4 + 4 * (size_t)i, p->outputs[i]);
        break;
    case SEC_CUDA:
        w = records(w, p->n_cuda, REC_CUDA);
        for (int32_t i = 0; i < p->n_cuda; i++, w += REC_CUDA) encode_cuda(w, &p->cuda[i]);
        break;
    case SEC_WAIT:
        put_u32(w, (uint32_t)p->n_waits);
        for (int32_t i = 0; i < p->n_waits; i++) put_i32(w + 4 + 4 * (size_t)i, p->waits[i]);
        break;
    case SEC_PROG:
        w = records(w, p->n_programs, REC_PROG);
        for (int32_t i = 0; i < p->n_programs; i++, w += REC_PROG) {
            const PlanProgram *g = &p->programs[i];
            const int32_t i32s[] = {g->stage, g->dp_world, g->first_op, g->n_ops};
            for (int k = 0; k < 4; k++) put_i32(w + 4 * k, i32s[k]);
            for (int k = 0; k < PLAN_PLACE_COUNT; k++) put_u64(w + 16 + 8 * k, (uint64_t)g->space_bytes[k]);
            const int32_t ranges[] = {g->first_tensor, g->n_tensors, g->first_output, g->n_outputs};
            for (int k = 0; k < 4; k++) put_i32(w + 32 + 4 * k, ranges[k]);
            put_u64(w + 48, (uint64_t)g->module_at);
            put_u64(w + 56, (uint64_t)g->module_len);
        }
        break;
    case SEC_CUMD: {
        size_t len = p->cuda_module ? strlen(p->cuda_module) : 0;
        put_u32(w, (uint32_t)len);
        if (len) memcpy(w + 4, p->cuda_module, len);
        break;
    }
    case SEC_EVAL:
    case SEC_SAMP:
    case SEC_DECO:
    case SEC_COUNT:
        break;
    }
}

/* The programs planned beside the training program, as whole plan files (sub[k] NULL
 * where p has none): EVAL, SAMP and DECO hold them, in that order. */
enum { N_SUB = 3 };
typedef struct {
    void *bytes[N_SUB];
    size_t len[N_SUB];
} Subplans;

/* Section s's index in Subplans, or -1 for a section of p's own. */
static int sub_of(int s) { return s == SEC_EVAL ? 0 : s == SEC_SAMP ? 1 : s == SEC_DECO ? 2 : -1; }

static int encode_subplans(const Plan *p, Subplans *sp, char *err, size_t errlen)
{
    const Plan *sub[N_SUB] = {p->eval, p->sample, p->decode};
    static const char *const what[N_SUB] = {"the evaluation program", "the sampling program", "the decode program"};
    *sp = (Subplans){{NULL}, {0}};
    for (int k = 0; k < N_SUB; k++) {
        char why[400];
        int32_t programs = k == 0 ? p->n_programs : 1;  // the evaluation: one per stage
        if (sub[k] && (sub[k]->eval || sub[k]->sample || sub[k]->decode))
            return plan_fail(err, errlen, "%s must have no programs of its own (programs nest one deep)", what[k]);
        if (sub[k] && sub[k]->n_programs != programs)
            return plan_fail(err, errlen, "%s must be a plan of %d program%s (one per stage), not %d", what[k], programs,
                             programs == 1 ? "" : "s", sub[k]->n_programs);
        if (sub[k] && plan_write_mem(sub[k], &sp->bytes[k], &sp->len[k], why, sizeof why))
            return plan_fail(err, errlen, "%s: %s", what[k], why);
    }
    return 0;
}

/* Whether section s is written: every one, but EVAL, SAMP and DECO only when p has them. */
static int written(const Subplans *sp, int s) { return sub_of(s) < 0 || sp->bytes[sub_of(s)] != NULL; }

static int encode_all(const Plan *p, const Subplans *sp, void **out, size_t *out_len, char *err, size_t errlen)
{
    uint64_t size[SEC_COUNT], off[SEC_COUNT];
    uint32_t n = 0;
    for (int s = 0; s < SEC_COUNT; s++) n += (uint32_t)written(sp, s);
    uint64_t total = PLAN_HEADER_SIZE + (uint64_t)PLAN_ENTRY_SIZE * n;
    for (int s = 0; s < SEC_COUNT; s++) {
        if (!written(sp, s)) continue;
        size[s] = sub_of(s) >= 0 ? sp->len[sub_of(s)] : section_size(p, s);
        off[s] = total;
        total += size[s];
        if (!size[s] || total > SIZE_MAX / 2) {
            snprintf(err, errlen, "plan too large to write (section %s)", TAGS[s]);
            return -1;
        }
    }
    uint8_t *buf = plan_alloc((size_t)total);
    if (!buf) {
        snprintf(err, errlen, "out of memory encoding a %llu-byte plan", (unsigned long long)total);
        return -1;
    }
    memcpy(buf, PLAN_MAGIC, PLAN_MAGIC_LEN);
    put_u16(buf + 8, PLAN_MAJOR);
    put_u16(buf + 10, PLAN_MINOR);
    put_u32(buf + 12, n);
    put_u64(buf + 16, total);
    put_u32(buf + 24, 0);
    put_u32(buf + 28, 0);
    for (int s = 0, i = 0; s < SEC_COUNT; s++) {
        if (!written(sp, s)) continue;
        uint8_t *data = buf + off[s], *e = buf + PLAN_HEADER_SIZE + PLAN_ENTRY_SIZE * i++;
        if (sub_of(s) >= 0)
            memcpy(data, sp->bytes[sub_of(s)], (size_t)size[s]);
        else
            encode(p, s, data);
        memcpy(e, TAGS[s], 4);
        put_u32(e + 4, plan_crc32(0, data, (size_t)size[s]));
        put_u64(e + 8, off[s]);
        put_u64(e + 16, size[s]);
    }
    /* The CRC field is still zero, which is how the reader computes it too. */
    put_u32(buf + PLAN_HEADER_CRC_AT, plan_crc32(0, buf, PLAN_HEADER_SIZE + PLAN_ENTRY_SIZE * n));
    *out = buf;
    *out_len = (size_t)total;
    return 0;
}

int plan_write_mem(const Plan *p, void **out, size_t *out_len, char *err, size_t errlen)
{
    *out = NULL;
    *out_len = 0;
    char why[200];
    if (plan_check(p, why, sizeof why)) {
        snprintf(err, errlen, "cannot write an invalid plan: %s", why);
        return -1;
    }
    Subplans sp;
    int rc = encode_subplans(p, &sp, err, errlen) || encode_all(p, &sp, out, out_len, err, errlen);
    for (int k = 0; k < N_SUB; k++) plan_dealloc(sp.bytes[k]);
    return rc ? -1 : 0;
}

/* ---- the file ----------------------------------------------------------------------- */

int plan_write(const Plan *p, const char *path, char *err, size_t errlen)
{
    void *buf;
    size_t len;
    if (plan_write_mem(p, &buf, &len, err, errlen)) return -1;
    PlanChunk whole = {buf, len};
    int rc = plan_write_atomic(path, &whole, 1, err, errlen);
    plan_dealloc(buf);
    return rc;
}
