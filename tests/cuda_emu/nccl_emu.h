/* tests/cuda_emu/nccl_emu.h: NCCL's collectives and point-to-point calls between cuda-emu
 * ranks, over MPI (nccl_emu.c says with which semantics). backend.c starts a collective
 * of its schedule (CsSchedule.colls, async) when the step reaches it and waits for it
 * where the stored waits say, and for all of them at the end of a run.
 */
#ifndef FS_CUDA_EMU_NCCL_H
#define FS_CUDA_EMU_NCCL_H

#include <stddef.h>
#include <stdint.h>

#include "ops.h"
#include "schedule.h"

typedef struct EmuNccl EmuNccl;

/* The communicators of world rank `rank` (stage s->stage, data-parallel index rank %
 * s->world), made alike on every rank (MPI must be started), over `arena`, the rank's
 * device arena. NULL with a message. */
EmuNccl *emu_nccl_new(const CsSchedule *s, uint8_t *arena, int rank, char *err, size_t errlen);
void emu_nccl_free(EmuNccl *n);
/* Starts collective (or send, or receive) ci of the schedule. 0, or -1 with a message. */
int emu_nccl_start(EmuNccl *n, int32_t ci, char *err, size_t errlen);
/* Completes ci (nothing if it is not in flight): its output written. 0, or -1. */
int emu_nccl_wait(EmuNccl *n, int32_t ci, char *err, size_t errlen);
int emu_nccl_wait_all(EmuNccl *n, char *err, size_t errlen);
/* --timeout, from another thread: the first collective in flight (-1: none); then the
 * communicators count as aborted (ncclCommAbort): every later call fails. */
int32_t emu_nccl_hung(EmuNccl *n);

#endif
