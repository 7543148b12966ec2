/* ir/types.c: names of the IR's small enums (roles, placements, phases, inits); the
 * dtypes are the op layer's (ops/types.c). */
#include "ir.h"

static const char *const ROLES[ROLE_COUNT] = {"input", "param", "grad", "act", "opt_state",
                                              "master", "comm", "scratch", "const", "gathered", "kv_cache",
                                              "param16"};
static const char *const PLACES[PLACE_COUNT] = {"device", "host"};
static const char *const PHASES[PHASE_COUNT] = {"forward", "backward", "recompute", "optimizer",
                                                "comm", "backward_weight"};
static const char *const INITS[INIT_COUNT] = {"none", "zeros", "ones", "normal", "uniform", "full"};

#define NAME_OF(table, i, count) ((unsigned)(i) < (unsigned)(count) ? (table)[i] : "?")

const char *role_name(Role r) { return NAME_OF(ROLES, r, ROLE_COUNT); }
const char *placement_name(Placement p) { return NAME_OF(PLACES, p, PLACE_COUNT); }
const char *phase_name(Phase p) { return NAME_OF(PHASES, p, PHASE_COUNT); }
const char *init_name(InitKind k) { return NAME_OF(INITS, k, INIT_COUNT); }
