/* runtime/cpu/comm_local.c: copy, the copies between memory spaces, and the collectives as one rank sees them alone.
 * With world 1 an average or a sum over ranks is the rank's own buffer, and a shard is
 * the whole; the executor sends collectives of a larger world to MPI instead. Outputs
 * may be their inputs (an in-place collective): then there is nothing to move. */
#include <string.h>

#include "cpu_impl.h"

static void move(const KCall *k)
{
    const KTensor *x = &k->in[0], *y = &k->out[0];
    size_t bytes = (size_t)x->numel * (x->dtype == KT_F16 || x->dtype == KT_BF16 ? 2 : 4);
    if (y->data != x->data) memmove(y->data, x->data, bytes);
}

void cpu_copy(const KCall *k) { move(k); }
/* Between the memory spaces: on the CPU backend the host space is an allocation of its
 * own, so these are real copies (the executor counts their bytes). */
void cpu_to_host(const KCall *k) { move(k); }
void cpu_to_device(const KCall *k) { move(k); }
void cpu_all_reduce(const KCall *k) { move(k); }
void cpu_reduce_scatter(const KCall *k) { move(k); }
void cpu_all_gather(const KCall *k) { move(k); }

/* Point-to-point ops have a peer, which a kernel alone does not: the executor binds each
 * to MPI (runtime/comm.c) and never calls these, and refuses a plan whose send or recv
 * it cannot bind. */
void cpu_send(const KCall *k) { (void)k; }
void cpu_recv(const KCall *k) { (void)k; }
