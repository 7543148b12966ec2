/* tests/support/alloc_count.h: the plan layer's allocation hook, for tests that fail
 * every allocation in turn: count_allocs(k) installs it, counting from zero, failing the
 * k-th allocation (0: none); n_allocs counts them, live the blocks not yet freed. Each
 * test file that includes it has its own counters. */
#ifndef FS_TEST_ALLOC_COUNT_H
#define FS_TEST_ALLOC_COUNT_H

#include <stdlib.h>

#include "plan.h"

static long n_allocs, live, fail_at;

static void *test_alloc(size_t n)
{
    if (fail_at && ++n_allocs == fail_at) return NULL;
    if (!fail_at) n_allocs++;
    void *p = malloc(n);
    if (p) live++;
    return p;
}

static void test_free(void *p)
{
    if (p) live--;
    free(p);
}

static void count_allocs(long fail)
{
    n_allocs = live = 0;
    fail_at = fail;
    plan_set_alloc(test_alloc, test_free);
}

#endif
