/* tests/cuda/test_cuda_fit.c: the check that a plan fits on its GPU before fsexec builds
 * anything (runtime/cuda/fit.c), without a GPU: the device's free memory is an argument.
 *  - The need is the plan's device space, cuBLAS's workspace (meta cuda_workspace_bytes)
 *    and the libraries' allowance; a plan fits up to its last byte.
 *  - Issue 35's case, GPT-2 1.5B at B = 47 in bf16: a 143,333 MiB arena against an H200
 *    with 142,629 MiB free (143,156 less a 527 MiB context) is refused, the message
 *    naming the device, what is free, what the plan needs and the --mem-limit to
 *    recompile with (the free memory less the workspace and the allowance, whole MiB);
 *    B = 46's 140,726 MiB fits.
 *  - A device with less free than the workspace and the allowance: no limit to suggest.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "fit.h"

#define MIB ((int64_t)1 << 20)

/* A plan of one program whose device space is `arena` bytes (workspace < 0: no meta). */
static Plan *plan_of(int64_t arena, int64_t workspace)
{
    Plan *p = plan_new();
    cr_assert_not_null(p);
    PlanProgram g = {.dp_world = 1, .space_bytes = {[PLAN_PLACE_DEVICE] = arena}};
    cr_assert_geq(plan_program_add(p, &g), 0);
    if (workspace >= 0) cr_assert_eq(plan_meta_set_int(p, "cuda_workspace_bytes", workspace), 0);
    return p;
}

Test(cuda_fit, need_is_arena_workspace_and_libraries)
{
    Plan *p = plan_of(1000 * MIB, -1);
    CudaNeed n = cuda_fit_need(p);
    cr_expect_eq(n.arena, 1000 * MIB);
    cr_expect_eq(n.workspace, 32 * MIB, "the default workspace");
    cr_expect_eq(n.libraries, CUDA_FIT_LIBRARIES);
    cr_expect_eq(cuda_fit_total(&n), 1000 * MIB + 32 * MIB + CUDA_FIT_LIBRARIES);
    plan_free(p);
    p = plan_of(1000 * MIB, 0);
    cr_expect_eq(cuda_fit_need(p).workspace, 0, "no workspace asked");
    plan_free(p);
}

Test(cuda_fit, fits_to_the_last_byte)
{
    Plan *p = plan_of(1000 * MIB, 32 * MIB);
    CudaNeed n = cuda_fit_need(p);
    char msg[512] = "";
    cr_expect_eq(cuda_fit_check(&n, cuda_fit_total(&n), 80 * 1024 * MIB, "cuda:0 X", msg, sizeof msg), 0, "%s", msg);
    cr_expect_eq(cuda_fit_check(&n, cuda_fit_total(&n) - 1, 80 * 1024 * MIB, "cuda:0 X", msg, sizeof msg), -1);
    plan_free(p);
}

Test(cuda_fit, an_arena_larger_than_the_gpu)
{
    int64_t total = 143156 * MIB, free_bytes = total - 527 * MIB;
    Plan *big = plan_of(143333 * MIB, 32 * MIB), *fits = plan_of(140726 * MIB, 32 * MIB);
    CudaNeed n = cuda_fit_need(big);
    char msg[512] = "";
    cr_assert_eq(cuda_fit_check(&n, free_bytes, total, "cuda:0 NVIDIA H200", msg, sizeof msg), -1);
    const char *want = "the plan needs 143429.0 MiB of cuda:0 NVIDIA H200 (arena 143333.0 MiB + cuBLAS workspace "
                       "32.0 MiB + about 64.0 MiB for the kernels and cuBLAS), and it has 142629.0 MiB free of "
                       "143156.0 MiB: recompile with fsc ... --mem-limit 142533MiB";
    cr_expect(!strncmp(msg, want, strlen(want)), "got: %s", msg);
    n = cuda_fit_need(fits);
    cr_expect_eq(cuda_fit_check(&n, free_bytes, total, "cuda:0 NVIDIA H200", msg, sizeof msg), 0, "%s", msg);
    plan_free(big), plan_free(fits);
}

Test(cuda_fit, no_room_at_all)
{
    Plan *p = plan_of(10 * MIB, 32 * MIB);
    CudaNeed n = cuda_fit_need(p);
    char msg[512] = "";
    cr_assert_eq(cuda_fit_check(&n, 50 * MIB, 80 * 1024 * MIB, "cuda:1 Y", msg, sizeof msg), -1);
    cr_expect(strstr(msg, "it has 50.0 MiB free of 81920.0 MiB: the device has no room for an arena"), "%s", msg);
    cr_expect(!strstr(msg, "--mem-limit"), "%s", msg);
    plan_free(p);
}
