/* ops/feed.c: which model inputs fsexec can feed from --data, as one rule that fsc (a
 * warning at the input's declaration) and fsexec (its error when it opens the data)
 * both ask, so the two never disagree.
 *
 * fsexec feeds any number of data inputs (inputs with a step role aside: the step,
 * dropout's rng, a decode position, which the runtime writes), each from a .npy file by
 * its name (--data x=feats.npy,y=labels.npy,mask=m.npy), which holds f32 or i32 data
 * (.npy float32/float64, int32/int64) with the batch as the first dim; and a model of
 * exactly two also from a token file or the built-in corpus (tokens and targets, i32
 * [B, T] each) or from Gaussian blobs (features and labels, f32 [B, D] and i32 [B]).
 * So an input cannot be fed when it is a 16-bit float, or a scalar (no batch dim to
 * draw samples along).
 */
#include <stdio.h>

#include "ops.h"

int op_input_unfed(const OpType *t, char *why, size_t len)
{
    if (t->dtype == DT_F16 || t->dtype == DT_BF16)
        snprintf(why, len, "fsexec reads f32 and i32 data (.npy float32/float64 and int32/int64, token files as i32), "
                 "not %s: declare the input f32 (the precision setting makes 16-bit copies)", dtype_name(t->dtype));
    else if (t->rank == 0)
        snprintf(why, len, "a scalar input has no batch dim to draw samples along, so fsexec cannot feed it from "
                 "--data; give it a first dim, the batch");
    else
        return 0;
    return 1;
}
