/* runtime/cpu/dropout.c: dropout(x, rng; p, key, batch, mb, mbs), PyTorch's training-mode
 * F.dropout: y = x * (1 / (1 - p)) where the mask keeps an element, else 0.
 *
 * The mask is ops/philox.h's, the CUDA kernel's too (codegen/kernels/dropout.cuh): element e
 * of the GLOBAL tensor is kept when fs_dropout_keep(seed, step, key, e, threshold) says
 * so, with seed and step from the rng words (i32 [4]: seed low, seed high, step, this
 * rank's data-parallel index; the runtime writes them) and key the op's number in the
 * model. A tensor with the batch as its first dim (batch = 1) is one part of the step's
 * global batch: this rank's micro-batch mb of mbs, so its element i is global element
 * (rank * mbs + mb) * numel + i, and every world size and micro-batch count draws the
 * same mask for the same element. The backward is this kernel on dy (ir/grad.c): the
 * same key, the same mask, nothing saved. The scale is 1 / (1 - p) computed in double
 * and rounded to float once; each element is x * scale (kept) or x * 0 (dropped) in f32,
 * rounded to the output's dtype once.
 */
#include "cpu_impl.h"
#include "philox.h"

#define DROP_CHUNK 1024  // elements per task: a multiple of 4, so tasks share no block

void cpu_dropout(const KCall *k)
{
    const KTensor *x = &k->in[0], *y = &k->out[0];
    const int32_t *rng = idata(&k->in[1]);
    KCHECK(k->in[1].dtype == KT_I32 && k->in[1].numel == 4, "dropout: rng must be i32 [4]");
    KCHECK(x->numel == y->numel && x->dtype == y->dtype, "dropout: y must be like x");
    double p = k->attr[2];
    KCHECK(p >= 0 && p < 1, "dropout: p = %g is outside [0, 1)", p);
    unsigned key = (unsigned)(int64_t)k->attr[3];
    int64_t n = x->numel, mb = (int64_t)k->attr[5], mbs = (int64_t)k->attr[6];
    uint64_t seed = (uint64_t)(uint32_t)rng[0] | (uint64_t)(uint32_t)rng[1] << 32;
    unsigned step = (uint32_t)rng[2];
    uint64_t base = k->attr[4] != 0 ? (uint64_t)(((int64_t)rng[3] * mbs + mb) * n) : 0;
    unsigned long long threshold = fs_dropout_threshold(p);
    float scale = (float)(1.0 / (1.0 - p));
    int64_t tasks = (n + DROP_CHUNK - 1) / DROP_CHUNK;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t t = 0; t < tasks; t++) {
        float v[DROP_CHUNK];
        int64_t at = t * DROP_CHUNK, len = imin(DROP_CHUNK, n - at);
        to_f32(v, x->data, x->dtype, at, len);
        unsigned w[4];
        uint64_t block = UINT64_MAX;
        for (int64_t i = 0; i < len; i++) {
            uint64_t e = base + (uint64_t)(at + i);
            if (e >> 2 != block) fs_dropout_words(seed, step, key, block = e >> 2, w);
            v[i] *= (unsigned long long)w[e & 3] < threshold ? scale : 0.0f;  // NaN * 0 stays NaN, as in PyTorch
        }
        from_f32(y->data, y->dtype, at, v, len);
    }
}
