/* ir/ops.c: the op table, generated from ir/ops.def. Signature strings are parsed once,
 * on first use, into OpParam lists; a malformed row is a bug caught by FS_ASSERT. */
#include <stdlib.h>
#include <string.h>

#include "ir.h"

static OpInfo table[OP_COUNT] = {
#define OP(name_, n_out_, flags_, sig_, g_)                                              \
    {.name = #name_, .n_out = n_out_, .flags = flags_, .sig = sig_,                      \
     .shape = shape_##name_, .flops = flops_##name_, .grad = grad_##g_},
#include "ops.def"
#undef OP
};
static int parsed;

/* Parameter names live in this static pool: the table is process-wide. */
static char names[OP_COUNT * IR_MAX_PARAMS][24];

static ArgKind kind_of(const char *type)
{
    static const struct { const char *s; ArgKind k; } kinds[] = {
        {"int", ARG_INT}, {"float", ARG_FLOAT}, {"ints", ARG_INTS}, {"flag", ARG_FLAG}};
    for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++)
        if (!strcmp(type, kinds[i].s)) return kinds[i].k;
    FS_ASSERT(!"unknown parameter type in ops.def");
}

/* "x, n:int, axis:int=-1" -> params. */
static void parse_sig(OpInfo *op, char (*pool)[24])
{
    const char *p = op->sig;
    op->n_tensors = 0;
    while (*p) {
        while (*p == ' ' || *p == ',') p++;
        if (!*p) break;
        FS_ASSERT(op->n_params < IR_MAX_PARAMS);
        OpParam *pr = &op->params[op->n_params];
        char *name = pool[op->n_params++];
        int variadic = *p == '*';
        p += variadic;
        size_t n = strcspn(p, ":=,");
        FS_ASSERT(n > 0 && n < 24);
        memcpy(name, p, n);
        name[n] = 0;
        pr->name = name;
        p += n;
        pr->kind = variadic ? ARG_TENSORS : ARG_TENSOR;
        if (*p == ':') {
            char type[16];
            size_t t = strcspn(++p, "=,");
            FS_ASSERT(t > 0 && t < sizeof type);
            memcpy(type, p, t);
            type[t] = 0;
            pr->kind = kind_of(type);
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
}

const OpInfo *op_info(OpKind op)
{
    FS_ASSERT((unsigned)op < OP_COUNT);
    if (!parsed) {
        for (int i = 0; i < OP_COUNT; i++) parse_sig(&table[i], &names[i * IR_MAX_PARAMS]);
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

const char *op_name(OpKind op) { return (unsigned)op < OP_COUNT ? table[op].name : "?"; }
