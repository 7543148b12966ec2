/* ops/philox.h: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
 * 3", SC'11; the generator of cuRAND and of PyTorch's CUDA RNG) and dropout's mask, the
 * one text that both the CPU (runtime/init.c, runtime/cpu/dropout.c) and the CUDA
 * kernels (every CUDA module carries FS_PHILOX_CUDA after its prelude, for
 * codegen/kernels/dropout.cuh) compile, so that every backend draws the same bits.
 *
 * FS_PHILOX_DEFS(QUAL) defines, with QUAL in front of each function:
 *   void fs_philox(unsigned long long key, c0, c1, c2, c3, unsigned int out[4])
 *       one block: the 128-bit counter (c0, c1, c2, c3) under the 64-bit key
 *   void fs_dropout_words(seed, step, op, block, unsigned int w[4])
 *       the words of dropout op `op` in step `step` for elements 4 block .. 4 block + 3:
 *       the block keyed by seed ^ FS_DROPOUT_KEY at counter (block low, high, step, op)
 *   int fs_dropout_keep(seed, step, op, elem, threshold)
 *       whether that op keeps element `elem` (its index in the global tensor): its word,
 *       w[elem % 4] of block elem / 4, is below threshold = fs_dropout_threshold(p)
 * The text is plain C that is also CUDA C++ (no preprocessor lines, no // comments), as
 * it is stringized whole into FS_PHILOX_CUDA.
 */
#ifndef FS_OPS_PHILOX_H
#define FS_OPS_PHILOX_H

#define FS_DROPOUT_KEY 0x64726F706F757421ull  // "dropout!": a stream apart from init's and data's

#define FS_PHILOX_DEFS(QUAL)                                                                             \
    QUAL void fs_philox(unsigned long long key, unsigned int c0, unsigned int c1, unsigned int c2,      \
                        unsigned int c3, unsigned int out[4])                                            \
    {                                                                                                    \
        unsigned int k0 = (unsigned int)key, k1 = (unsigned int)(key >> 32);                            \
        for (int r = 0; r < 10; r++) {                                                                   \
            if (r) {                                                                                     \
                k0 += 0x9E3779B9u;                                                                       \
                k1 += 0xBB67AE85u;                                                                       \
            }                                                                                            \
            unsigned long long p0 = 0xD2511F53ull * c0, p1 = 0xCD9E8D57ull * c2;                         \
            unsigned int hi0 = (unsigned int)(p0 >> 32), lo0 = (unsigned int)p0;                        \
            unsigned int hi1 = (unsigned int)(p1 >> 32), lo1 = (unsigned int)p1;                        \
            c0 = hi1 ^ c1 ^ k0;                                                                          \
            c1 = lo1;                                                                                    \
            c2 = hi0 ^ c3 ^ k1;                                                                          \
            c3 = lo0;                                                                                    \
        }                                                                                                \
        out[0] = c0;                                                                                     \
        out[1] = c1;                                                                                     \
        out[2] = c2;                                                                                     \
        out[3] = c3;                                                                                     \
    }                                                                                                    \
    QUAL void fs_dropout_words(unsigned long long seed, unsigned int step, unsigned int op,             \
                               unsigned long long block, unsigned int w[4])                              \
    {                                                                                                    \
        fs_philox(seed ^ FS_DROPOUT_KEY, (unsigned int)block, (unsigned int)(block >> 32), step, op, w);  \
    }                                                                                                    \
    QUAL int fs_dropout_keep(unsigned long long seed, unsigned int step, unsigned int op,              \
                             unsigned long long elem, unsigned long long threshold)                      \
    {                                                                                                    \
        unsigned int w[4];                                                                               \
        fs_dropout_words(seed, step, op, elem >> 2, w);                                                  \
        return (unsigned long long)w[elem & 3] < threshold;                                              \
    }

/* An element is kept when its 32-bit word is below (1 - p) 2^32: probability 1 - p to
 * within 2^-32 (p in [0, 1)). */
static inline unsigned long long fs_dropout_threshold(double p)
{
    return (unsigned long long)((1.0 - p) * 4294967296.0);
}

#define FS_PHILOX_STR_(...) #__VA_ARGS__
#define FS_PHILOX_STR(...) FS_PHILOX_STR_(__VA_ARGS__)
/* The same functions as CUDA device code, a string literal for a module's text; not static,
 * like the prelude's functions (NVRTC warns of a static one a module does not call). */
#define FS_PHILOX_CUDA FS_PHILOX_STR(FS_PHILOX_DEFS(__device__ __forceinline__)) "\n"

FS_PHILOX_DEFS(static inline)

#endif
