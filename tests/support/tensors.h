/* tests/support/tensors.h: the kernel tests' buffers, each freed after its test
 * (TestSuite(name, .fini = tensors_free)), and S(...), a shape written in place:
 * S(2, 3) is the rank 2 and the dims {2, 3}. */
#ifndef FS_TEST_TENSORS_H
#define FS_TEST_TENSORS_H

#include <criterion/criterion.h>
#include <stdlib.h>

#define S(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}

static void *bufs[4096];
static int nbufs;

static void tensors_free(void)
{
    for (int i = 0; i < nbufs; i++) free(bufs[i]);
    nbufs = 0;
}

/* bytes (at least 1) that tensors_free frees. */
static void *track(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    cr_assert(p && nbufs < 4096);
    return bufs[nbufs++] = p;
}

#endif
