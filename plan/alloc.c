/* plan/alloc.c: the one allocation hook of the plan layer (Lua's lua_Alloc, smaller).
 * Every byte plan/ allocates comes from plan_alloc, so a test can fail the k-th call and
 * check that every path out of an allocation failure reports it and frees the rest. */
#include <stdlib.h>

#include "plan.h"

static void *(*alloc_hook)(size_t) = malloc;
static void (*free_hook)(void *) = free;

void plan_set_alloc(void *(*alloc_fn)(size_t), void (*free_fn)(void *))
{
    alloc_hook = alloc_fn ? alloc_fn : malloc;
    free_hook = free_fn ? free_fn : free;
}

void *plan_alloc(size_t n) { return alloc_hook(n ? n : 1); }

void plan_dealloc(void *p)
{
    if (p) free_hook(p);
}
