/* tests/support/sample.h: what many tests do first: compile a sample in process, through
 * the frontend, every pass and codegen, as fsc does, into a plan in memory. */
#ifndef FS_TEST_SAMPLE_H
#define FS_TEST_SAMPLE_H

#include "codegen.h"
#include "frontend.h"
#include "passes.h"
#include "runtime.h"

/* samples/FILE with -D defines and --key value settings; the graph too when g is not
 * NULL (the caller frees it). Fails the current Criterion test on any error. */
Plan *sample_compile(const char *file, const Define *defs, int n_defs, const Setting *set, int n_set, Graph **g);
/* The text of samples/FILE, in a static buffer the next call overwrites. */
const char *sample_source(const char *file);
/* samples/FILE's text with `text` inserted before the first `before`, in a static buffer
 * of its own that the next call overwrites. */
const char *sample_source_with(const char *file, const char *before, const char *text);
/* The same for source text src, named `file` in messages. */
Plan *sample_compile_source(const char *file, const char *src, const Define *defs, int n_defs, const Setting *set,
                            int n_set, Graph **g);

/* Every gradient the optimizer reads after step 1's backward (seed 5, synthetic data in
 * order), f32, the params' in tensor order, concatenated; *n floats. Free with free(). */
float *sample_step1_grads(const Plan *p, size_t *n);
/* The losses (the plan's first output) of `steps` steps from `seed` on synthetic data in
 * order, into loss[0 .. steps). */
void sample_losses(const Plan *p, uint64_t seed, int steps, float *loss);
/* An Exec of p from `seed` and, in *data, its synthetic data in order (the caller closes
 * both); sample_train runs `steps` steps of it as sample_losses does and returns it. */
Exec *sample_exec(const Plan *p, uint64_t seed, RtData **data);
Exec *sample_train(const Plan *p, uint64_t seed, int steps, float *loss);
/* The same with options of the caller's (its seed seeds the data too). */
Exec *sample_exec_with(const Plan *p, const ExecOptions *eo, RtData **data);
Exec *sample_train_with(const Plan *p, const ExecOptions *eo, int steps, float *loss);
/* The same, then every f32 param and master in a buffer of its own (in tensor order,
 * concatenated; *n floats) after the last step. Free with free(). */
float *sample_trained(const Plan *p, uint64_t seed, int steps, float *loss, size_t *n);

/* Small dims that train a step in milliseconds. */
extern const Define SAMPLE_GPT2[6], SAMPLE_LLAMA[7];

#endif
