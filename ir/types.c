/* ir/types.c: names and sizes of the IR's small enums (dtypes, roles, phases, inits). */
#include <string.h>

#include "ir.h"

static const char *const DTYPES[DT_COUNT] = {"f32", "f16", "bf16", "i32"};
static const int DTYPE_SIZES[DT_COUNT] = {4, 2, 2, 4};
static const char *const ROLES[ROLE_COUNT] = {"input", "param", "grad", "act", "opt_state",
                                              "master", "comm", "scratch", "const", "gathered"};
static const char *const PLACES[PLACE_COUNT] = {"device", "host"};
static const char *const PHASES[PHASE_COUNT] = {"forward", "backward", "recompute", "optimizer",
                                                "comm"};
static const char *const INITS[INIT_COUNT] = {"none", "zeros", "ones", "normal", "uniform", "full"};

#define NAME_OF(table, i, count) ((unsigned)(i) < (unsigned)(count) ? (table)[i] : "?")

const char *dtype_name(DType t) { return NAME_OF(DTYPES, t, DT_COUNT); }
int dtype_size(DType t) { return (unsigned)t < DT_COUNT ? DTYPE_SIZES[t] : 0; }
int dtype_is_float(DType t) { return t == DT_F32 || t == DT_F16 || t == DT_BF16; }
const char *role_name(Role r) { return NAME_OF(ROLES, r, ROLE_COUNT); }
const char *placement_name(Placement p) { return NAME_OF(PLACES, p, PLACE_COUNT); }
const char *phase_name(Phase p) { return NAME_OF(PHASES, p, PHASE_COUNT); }
const char *init_name(InitKind k) { return NAME_OF(INITS, k, INIT_COUNT); }

int dtype_parse(const char *s, DType *out)
{
    for (int i = 0; i < DT_COUNT; i++)
        if (!strcmp(s, DTYPES[i])) {
            *out = (DType)i;
            return 0;
        }
    return -1;
}
