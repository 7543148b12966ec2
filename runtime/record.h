/* runtime/record.h: what a checkpoint's manifest records of the run beyond its state (the
 * model's dims and param set, the data source), and the comparisons a resume makes with
 * them (runtime/record.c). Private to checkpoint.c, resume.c and record.c: the manifest is
 * jansson's, and nothing else of the runtime speaks JSON. */
#ifndef FS_RUNTIME_RECORD_H
#define FS_RUNTIME_RECORD_H

#include <jansson.h>

#include "runtime.h"

/* {"dims": "B=8 T=64 ...", "batch_dim": "B", "param_set": "<FNV-1a of every param's name and
 * shape>", "params": N}: of the whole plan (every stage). NULL when out of memory. */
json_t *rt_record_model(const Plan *whole);
/* {"kind": "tokens" | "npy" | "synthetic", "files": [{"name", "path", "bytes", "head_crc32"}]}
 * of --data as given (NULL: the built-in data): each file's absolute path, size and the
 * CRC-32 of its first MiB. NULL when out of memory. */
json_t *rt_record_data(const char *data);
/* The checkpoint's manifest (checkpoint.c). */
const json_t *rt_checkpoint_manifest(const RtCheckpoint *c);

#endif
