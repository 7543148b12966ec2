/* ops/feed.c: which model inputs fsexec can feed from --data, as one rule that fsc (a
 * warning at the input's declaration) and fsexec (its error when it opens the data)
 * both ask, so the two never disagree.
 *
 * fsexec feeds a model of exactly two data inputs (inputs with a step role aside: the
 * step, dropout's rng, a decode position, which the runtime writes):
 * tokens and targets (i32 [B, T] each) from a token file or the built-in corpus,
 * features and labels (f32 [B, D], i32 [B]) from Gaussian blobs, and any two inputs
 * from .npy files (--data x=feats.npy,y=labels.npy), which hold f32 or i32 data (.npy
 * float32/float64, int32/int64) with the batch as the first dim. So an input cannot be
 * fed when it is a third one, a 16-bit float, or a scalar (no batch dim to draw samples
 * along); and a model with one input cannot be fed at all.
 */
#include <stdio.h>

#include "ops.h"

int op_input_unfed(const OpType *inputs, int n, char *why, size_t len)
{
    if (n < 2) {
        snprintf(why, len, "fsexec feeds models of two data inputs (tokens and targets, or features and labels); "
                 "this one has %d, so fsexec cannot train it", n);
        return 0;
    }
    for (int i = 0; i < n; i++) {
        const OpType *t = &inputs[i];
        if (i >= 2)
            snprintf(why, len, "fsexec feeds models of two data inputs (tokens and targets, or features and labels); "
                     "this is input %d, so fsexec cannot train the model", i + 1);
        else if (t->dtype == DT_F16 || t->dtype == DT_BF16)
            snprintf(why, len, "fsexec reads f32 and i32 data (.npy float32/float64 and int32/int64, token files as "
                     "i32), not %s: declare the input f32 (the precision setting makes 16-bit copies)",
                     dtype_name(t->dtype));
        else if (t->rank == 0)
            snprintf(why, len, "a scalar input has no batch dim to draw samples along, so fsexec cannot feed it "
                     "from --data; give it a first dim, the batch");
        else
            continue;
        return i;
    }
    return -1;
}
