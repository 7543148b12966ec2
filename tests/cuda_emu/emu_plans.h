/* tests/cuda_emu/emu_plans.h: small hand-made plans for the cuda-emu tests (emu_plans.c). */
#ifndef FS_CUDA_EMU_PLANS_H
#define FS_CUDA_EMU_PLANS_H

#include "backend.h"

/* The backend's table, once emu_plans_load (a suite's .init) has loaded it. */
extern const RtBackendOps *ops;
void emu_plans_load(void);

typedef struct {
    Plan *p;
    int64_t top;        // arena bytes used
    void *host;         // the host arena
    RtBackend *b;
    char err[4096];
} T;

/* A plan whose CUDA module is source. */
T *t_new(const char *source);
/* A tensor of numel elements of dt, at the next 64-byte boundary. */
int32_t tensor(T *t, PlanDType dt, int64_t numel);
/* A view: numel elements of root from element `at`. */
int32_t view(T *t, int32_t root, int64_t at, int64_t numel);
/* An op named name (no inputs or outputs of its own). */
int32_t op(T *t, const char *name);
/* A launch of kernel (an op of its own) on gx x gy blocks of bx x by threads; its index
 * among the plan's instructions (set .smem there for dynamic shared memory). */
int32_t launch(T *t, const char *kernel, int gx, int gy, int bx, int by, const int32_t *args, int n);
/* A GEMM of shape's form on A, B, C. */
void gemm(T *t, int32_t A, int32_t B, int32_t C, const PlanCuda *shape);
/* The host arena's bytes of tensor id, as floats: inputs are set here, results read. */
float *t_f32(T *t, int32_t id);
/* Makes the backend and runs every op: 0, or -1 with the message in t->err. */
int t_run(T *t);
void t_free(T *t);
/* source's kernel on two f32 tensors of n (x = 0, 1, ...), bx threads: must fail saying want. */
void expect_error(const char *source, const char *kernel, int bx, int n, const char *want);

#endif
