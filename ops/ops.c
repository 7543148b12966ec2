/* ops/ops.c: the op table, generated from ops/ops.def. Signature strings are parsed
 * once, on first use, into OpParam lists; a malformed row (a bad signature, a
 * collective without its kind) is a bug in ops.def and aborts with what is wrong. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

static OpInfo table[OP_COUNT] = {
#define OP(name_, n_out_, flags_, sig_, grad_, comm_)                                     \
    {.name = #name_, .n_out = n_out_, .flags = flags_, .comm = COMM_##comm_, .sig = sig_, \
     .shape = shape_##name_},
#include "ops.def"
#undef OP
};
static int parsed;

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

const OpInfo *op_info(OpKind op)
{
    if ((unsigned)op >= OP_COUNT) {
        fprintf(stderr, "op_info: op kind %d is not in the table\n", (int)op);
        abort();
    }
    if (!parsed) {
        for (int i = 0; i < OP_COUNT; i++) parse_sig(&table[i], &names[i * OPS_MAX_PARAMS]);
        parsed = 1;
    }
    return &table[op];
}

OpKind op_lookup(const char *name)
{
    for (int i = 0; i < OP_COUNT; i++)
        if (!strcmp(table[i].name, name)) return (OpKind)i;
    return OP_COUNT;
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
