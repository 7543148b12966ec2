/* ops/ops.c: the op table, generated from ops/ops.def. Signature strings are parsed
 * once, on first use (call_once: the runtime's threads may be first), into OpParam
 * lists, and the names into a hash index for op_lookup, which every report and the
 * planner call per op; a malformed row (a bad signature, a collective without its kind)
 * is a bug in ops.def and aborts with what is wrong. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <threads.h>

#include "ops.h"

static OpInfo table[OP_COUNT] = {
#define OP(name_, n_out_, flags_, sig_, grad_, comm_)                                     \
    {.name = #name_, .n_out = n_out_, .flags = flags_, .comm = COMM_##comm_, .sig = sig_, \
     .shape = shape_##name_},
#include "ops.def"
#undef OP
};
static once_flag parsed = ONCE_FLAG_INIT;

/* Open addressing over FNV-1a of the name: each slot an op kind + 1, or 0 when empty. */
enum { INDEX_SLOTS = 256 };
_Static_assert(OP_COUNT < INDEX_SLOTS / 2, "the name index must stay at most half full");
static uint8_t name_index[INDEX_SLOTS];

static unsigned name_hash(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h % INDEX_SLOTS;
}

/* Parameter names live in this static pool: the table is process-wide. */
static char names[OP_COUNT * OPS_MAX_PARAMS][24];

static _Noreturn void bad_row(const OpInfo *op, const char *what)
{
    fprintf(stderr, "ops/ops.def: op '%s': %s\n", op->name, what);
    abort();
}

static ArgKind kind_of(const OpInfo *op, const char *type)
{
    static const struct { const char *s; ArgKind k; } kinds[] = {
        {"int", ARG_INT}, {"float", ARG_FLOAT}, {"ints", ARG_INTS}, {"flag", ARG_FLAG}};
    for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++)
        if (!strcmp(type, kinds[i].s)) return kinds[i].k;
    bad_row(op, "unknown parameter type in the signature");
}

/* "x, n:int, axis:int=-1" -> params. */
static void parse_sig(OpInfo *op, char (*pool)[24])
{
    const char *p = op->sig;
    op->n_tensors = 0;
    while (*p) {
        while (*p == ' ' || *p == ',') p++;
        if (!*p) break;
        if (op->n_params >= OPS_MAX_PARAMS) bad_row(op, "more signature parameters than OPS_MAX_PARAMS");
        OpParam *pr = &op->params[op->n_params];
        char *name = pool[op->n_params++];
        int variadic = *p == '*';
        p += variadic;
        size_t n = strcspn(p, ":=,");
        if (n == 0 || n >= 24) bad_row(op, "a parameter name is empty or longer than 23 characters");
        memcpy(name, p, n);
        name[n] = 0;
        pr->name = name;
        p += n;
        pr->kind = variadic ? ARG_TENSORS : ARG_TENSOR;
        if (*p == ':') {
            char type[16];
            size_t t = strcspn(++p, "=,");
            if (t == 0 || t >= sizeof type) bad_row(op, "a parameter type is empty or too long");
            memcpy(type, p, t);
            type[t] = 0;
            pr->kind = kind_of(op, type);
            p += t;
        }
        if (*p == '=') {
            char *end;
            pr->def = strtod(p + 1, &end);
            pr->has_default = 1;
            p = end;
        }
        if (pr->kind == ARG_TENSOR) op->n_tensors++;
        if (pr->kind == ARG_TENSORS) op->n_tensors = -1;
    }
    int moves = (op->flags & (OPF_COLLECTIVE | OPF_P2P | OPF_COPY)) != 0;
    if (moves != (op->comm != COMM_NONE))
        bad_row(op, "an OPF_COLLECTIVE, OPF_P2P or OPF_COPY op names what it moves in the comm column, and no other op does");
}

static void parse_table(void)
{
    for (int i = 0; i < OP_COUNT; i++) {
        parse_sig(&table[i], &names[i * OPS_MAX_PARAMS]);
        unsigned h = name_hash(table[i].name);
        while (name_index[h]) h = (h + 1) % INDEX_SLOTS;
        name_index[h] = (uint8_t)(i + 1);
    }
}

const OpInfo *op_info(OpKind op)
{
    if ((unsigned)op >= OP_COUNT) {
        fprintf(stderr, "op_info: op kind %d is not in the table\n", (int)op);
        abort();
    }
    call_once(&parsed, parse_table);
    return &table[op];
}

OpKind op_lookup(const char *name)
{
    call_once(&parsed, parse_table);
    for (unsigned h = name_hash(name);; h = (h + 1) % INDEX_SLOTS) {
        int k = name_index[h] - 1;
        if (k < 0) return OP_COUNT;
        if (!strcmp(table[k].name, name)) return (OpKind)k;
    }
}

const OpInfo *op_info_by_name(const char *name)
{
    OpKind k = op_lookup(name);
    return k == OP_COUNT ? NULL : op_info(k);
}

const char *op_name(OpKind op) { return (unsigned)op < OP_COUNT ? table[op].name : "?"; }

int op_param_index(const OpInfo *info, const char *key)
{
    for (int i = 0; i < info->n_params; i++)
        if (info->params[i].kind != ARG_TENSOR && info->params[i].kind != ARG_TENSORS && !strcmp(info->params[i].name, key))
            return i;
    return -1;
}

OpComm op_comm_by_name(const char *name)
{
    const OpInfo *info = op_info_by_name(name);
    return info ? info->comm : COMM_NONE;
}

const char *op_comm_name(OpComm k)
{
    for (int i = 0; k != COMM_NONE && i < OP_COUNT; i++)
        if (table[i].comm == k) return table[i].name;
    return "?";
}
