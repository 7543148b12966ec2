/* tests/mpi/collectives.c: runtime/comm.c against a real MPI world (run under mpirun by
 * collectives.sh, at several world sizes): every collective in each of its in-place
 * forms (all_reduce on itself; reduce_scatter into the start of its input, into this
 * rank's slice of it, and apart; all_gather from this rank's slice and from apart), the
 * average, waiting only for what an op touches, polling to completion, the same again as
 * persistent collectives started step after step (rt_comm_bind, where MPI has them),
 * 16-bit floats (f16, bf16: summed by comm.c's own MPI ops, then averaged), and the
 * blocking helpers (gather to rank 0, agree, sum). Prints one line per rank;
 * exit 1 on a mismatch.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels.h"
#include "runtime.h"

static int rank;

/* x[i] = (rank + 1) * (i + 1) on every rank: the sum over ranks is S * (i + 1). */
static void fill(float *x, int n)
{
    for (int i = 0; i < n; i++) x[i] = (float)(rank + 1) * (float)(i + 1);
}

int main(void)
{
    RtRanks rk;
    char err[256];
    if (rt_ranks_from_env(&rk, err, sizeof err) || rt_comm_init(&rk, err, sizeof err)) {
        printf("%s\n", err);
        return 1;
    }
    rank = me = rk.rank;
    int W = rk.world, n = 5;
    float S = (float)(W * (W + 1) / 2);
    RtCommQueue *q = rt_comm_queue_new(4);
    float *buf = calloc((size_t)(n * W * 3), sizeof *buf), *apart = buf + 2 * n * W;
    RtColl c, d;

    fill(buf, n * W);  // all_reduce in place, averaged
    CHECK(!rt_coll_prepare(&c, RT_COLL_ALL_REDUCE, PLAN_DT_F32, buf, n * W, buf, n * W, W, rank, 1, err, sizeof err),
          "%s", err);
    rt_comm_start(q, &c);
    rt_comm_wait_all(q);
    for (int i = 0; i < n * W; i++) CHECK(buf[i] == S * (float)(i + 1) / (float)W, "all_reduce[%d] = %g", i, buf[i]);

    fill(buf, n * W);  // reduce_scatter into this rank's slice of x, averaged
    float *mine = buf + rank * n;
    CHECK(!rt_coll_prepare(&c, RT_COLL_REDUCE_SCATTER, PLAN_DT_F32, buf, n * W, mine, n, W, rank, 1, err, sizeof err),
          "%s", err);
    rt_comm_start(q, &c);
    rt_comm_wait_for(q, &d);  // not started: nothing to wait for
    CHECK(rt_comm_pending(q) == 1, "waited for a collective that was not in flight");
    rt_comm_wait_for(q, &c);
    CHECK(rt_comm_pending(q) == 0, "did not wait for the one named");
    for (int i = 0; i < n; i++)
        CHECK(mine[i] == S * (float)(rank * n + i + 1) / (float)W, "reduce_scatter slice[%d] = %g", i, mine[i]);

    fill(buf, n * W);  // reduce_scatter into the start of x, and apart, both in flight
    fill(buf + n * W, n * W);
    CHECK(!rt_coll_prepare(&c, RT_COLL_REDUCE_SCATTER, PLAN_DT_F32, buf, n * W, buf, n, W, rank, 0, err, sizeof err),
          "%s", err);
    CHECK(!rt_coll_prepare(&d, RT_COLL_REDUCE_SCATTER, PLAN_DT_F32, buf + n * W, n * W, apart, n, W, rank, 0, err,
                           sizeof err), "%s", err);
    rt_comm_start(q, &c);
    rt_comm_start(q, &d);
    while (rt_comm_pending(q)) rt_comm_poll(q);
    for (int i = 0; i < n; i++) {
        CHECK(buf[i] == S * (float)(rank * n + i + 1), "reduce_scatter start[%d] = %g", i, buf[i]);
        CHECK(apart[i] == S * (float)(rank * n + i + 1), "reduce_scatter apart[%d] = %g", i, apart[i]);
    }

    for (int i = 0; i < n * W; i++) buf[i] = -1;  // all_gather from this rank's slice
    for (int i = 0; i < n; i++) buf[rank * n + i] = (float)(100 * rank + i);
    CHECK(!rt_coll_prepare(&c, RT_COLL_ALL_GATHER, PLAN_DT_F32, buf + rank * n, n, buf, n * W, W, rank, 0, err,
                           sizeof err), "%s", err);
    CHECK(c.in_place, "all_gather from its slice runs in place");
    rt_comm_start(q, &c);
    rt_comm_wait_all(q);
    for (int r = 0; r < W; r++)
        for (int i = 0; i < n; i++) CHECK(buf[r * n + i] == (float)(100 * r + i), "all_gather[%d][%d]", r, i);

    float x[5] = {1, 2, 3, 4, (float)rank};  // all_gather from apart
    CHECK(!rt_coll_prepare(&c, RT_COLL_ALL_GATHER, PLAN_DT_F32, x, n, buf + n * W, n * W, W, rank, 0, err, sizeof err),
          "%s", err);
    rt_comm_start(q, &c);
    rt_comm_wait_all(q);
    for (int r = 0; r < W; r++) CHECK(buf[n * W + r * n + 4] == (float)r, "all_gather apart[%d]", r);

    /* Persistent (where MPI has them): bound once, started every step, like a plan's. */
    RtColl rs, ag;
    CHECK(!rt_coll_prepare(&rs, RT_COLL_REDUCE_SCATTER, PLAN_DT_F32, buf, n * W, mine, n, W, rank, 1, err, sizeof err),
          "%s", err);
    CHECK(!rt_coll_prepare(&ag, RT_COLL_ALL_GATHER, PLAN_DT_F32, mine, n, buf, n * W, W, rank, 0, err, sizeof err),
          "%s", err);
    rt_comm_bind(q, &rs);
    rt_comm_bind(q, &ag);
    for (int step = 1; step <= 3; step++) {
        fill(buf, n * W);
        for (int i = 0; i < n * W; i++) buf[i] *= (float)step;
        rt_comm_start(q, &rs);
        rt_comm_wait_all(q);
        rt_comm_start(q, &ag);  // every rank's averaged slice, gathered back in place
        rt_comm_poll(q);
        rt_comm_wait_for(q, &ag);  // done already, or waited for now
        for (int i = 0; i < n * W; i++)
            CHECK(buf[i] == (float)step * S * (float)(i + 1) / (float)W, "step %d: [%d] = %g", step, i, buf[i]);
    }

    /* 16-bit: f16 all_reduce averaged (nonblocking), bf16 reduce_scatter averaged into
     * this rank's slice. The values are small integers, exact in both, so the result is
     * the f32 one rounded once. */
    uint16_t h[20 * 3], want;
    for (int i = 0; i < n * W; i++) h[i] = cpu_f32_to_f16((float)(rank + 1) * (float)(i + 1));
    CHECK(!rt_coll_prepare(&c, RT_COLL_ALL_REDUCE, PLAN_DT_F16, h, n * W, h, n * W, W, rank, 1, err, sizeof err),
          "%s", err);
    rt_comm_start(q, &c);
    rt_comm_wait_all(q);
    for (int i = 0; i < n * W; i++) {
        want = cpu_f32_to_f16(S * (float)(i + 1) / (float)W);
        CHECK(h[i] == want, "f16 all_reduce[%d] = %g, expected %g", i, cpu_f16_to_f32(h[i]), cpu_f16_to_f32(want));
    }
    for (int i = 0; i < n * W; i++) h[i] = cpu_f32_to_bf16((float)(rank + 1) * (float)(i + 1));
    CHECK(!rt_coll_prepare(&c, RT_COLL_REDUCE_SCATTER, PLAN_DT_BF16, h, n * W, h + rank * n, n, W, rank, 1, err,
                           sizeof err), "%s", err);
    rt_comm_start(q, &c);
    rt_comm_wait_all(q);
    for (int i = 0; i < n; i++) {
        want = cpu_f32_to_bf16(S * (float)(rank * n + i + 1) / (float)W);
        CHECK(h[rank * n + i] == want, "bf16 reduce_scatter[%d] = %g, expected %g", i,
              cpu_bf16_to_f32(h[rank * n + i]), cpu_bf16_to_f32(want));
    }

    float part[3] = {(float)rank, (float)rank, (float)rank}, *all = calloc((size_t)(3 * W), sizeof *all);
    rt_comm_gather_f32(part, 3, all);
    for (int r = 0; rank == 0 && r < W; r++) CHECK(all[3 * r + 2] == (float)r, "gather[%d]", r);
    CHECK(rt_comm_agree(rank == W - 1) == 1, "agree: one rank's error is everyone's");
    CHECK(rt_comm_sum_i64(rank) == (int64_t)W * (W - 1) / 2, "sum");

    printf("[rank %d of %d] %s (%s collectives)\n", rank, W, fails ? "FAILED" : "ok",
           rs.slot >= 0 ? "persistent" : "nonblocking");
    rt_comm_queue_free(q);
    free(buf);
    free(all);
    rt_comm_finalize();
    return fails != 0;
}
