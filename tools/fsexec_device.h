/* tools/fsexec_device.h: fsexec's glue to a device backend (runtime/backend.h): which
 * device runs the steps, and the tensors that move between it and the host mirror (the
 * CPU Exec) around each step and before files are written. With the CPU chosen, every
 * call here does nothing, so the step loop reads the same either way.
 */
#ifndef FS_FSEXEC_DEVICE_H
#define FS_FSEXEC_DEVICE_H

#include <stdio.h>

#include "backend.h"
#include "runtime.h"

enum { DEV_AUTO, DEV_CPU, DEV_CUDA };

typedef struct {
    const RtBackendOps *ops;  // the backend that runs the steps, or NULL: the CPU does
    RtBackend *b;
    char name[200];           // for the start line: "cuda:0 NVIDIA H200 (sm_90)", "cpu (no CUDA driver)"
    int32_t *up, *down;       // each step: the inputs up before it, the reported outputs down after
    int n_up, n_down;
    int32_t *step;            // the plan's i32 "step" in the host mirror, written before each upload; or NULL
} Device;

/* Chooses the device for `want` (DEV_*): the CUDA backend for DEV_CUDA, and for DEV_AUTO
 * when every rank has a GPU and the plan a CUDA program (debug modes: the CPU); else the
 * CPU, with the reason in d->name. Every rank calls it and they agree. 0, or 1 after a
 * message (DEV_CUDA where it cannot run). */
int device_choose(Device *d, int want, int debug, const Plan *p, const char *who);
/* Makes the chosen backend from e as it is now (initialized, weights loaded); the ids
 * in `report` (-1: none) come down after each step. 0, or -1 after a message. */
int device_open(Device *d, const Exec *e, const RtRanks *rk, int tf32, const int32_t *report, int n_report);
/* Ops [from, to) of a step, on the device or (none chosen) the CPU. */
int device_run_ops(Device *d, Exec *e, int64_t step, int32_t from, int32_t to);
/* The whole step; graph: as a captured CUDA graph (after the first). */
int device_run_step(Device *d, Exec *e, int64_t step, int graph);
/* Tensors up to the device from the host mirror (up), or down into it. */
int device_move(Device *d, Exec *e, int up, const int32_t *ids, int n);
/* The step's moves: its inputs up (with the step number), its reports down. */
int device_step_in(Device *d, Exec *e, int64_t step);
int device_step_out(Device *d, Exec *e);
/* Down into the host mirror: every tensor of the roles (a bit each); roots only unless
 * `views` (a view lies in its root's bytes). */
int device_download_roles(Device *d, Exec *e, unsigned roles, int views);
/* The backend's memory and kernels, two lines for the start. */
void device_report(const Device *d, FILE *out);
/* Prints the backend's last failure (it names the rank, the call, the op) with the step
 * (step > 0). */
void device_print_error(const Device *d, int64_t step);
void device_close(Device *d);

#endif
