/* runtime/checkpoint.h: what the checkpoint files share and nothing else includes:
 * checkpoint.c (saving, opening, reading), ckdir.c (the directory as a whole: checks at
 * start, size, pruning), ckexport.c (the consolidated export) and ckfs.c (file handling).
 *
 * ckfs.c: every name inside a checkpoint is opened relative to its directory's
 * descriptor, without following a link, and checked with fstat. Each function takes
 * `shown`, the directory's path for messages, and says in err what a path is when it is
 * not what fsexec made ("DIR/step-00000003 is a symbolic link").
 */
#ifndef FS_RUNTIME_CHECKPOINT_H
#define FS_RUNTIME_CHECKPOINT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "runtime.h"

#define MANIFEST "manifest.json"

/* ---- runtime/ckfs.c ---------------------------------------------------------------- */

/* The directory at path (the user's own: followed as given), made first when `create`;
 * its descriptor, or -1 with a message. */
int ckfs_root(const char *path, int create, char *err, size_t errlen);
/* The directory `name` inside at, never through a link: made first when `create` and
 * absent (*made then says so, when given); its descriptor, or -1 with a message. */
int ckfs_dir(int at, const char *shown, const char *name, int create, int *made, char *err, size_t errlen);
/* The regular file `name` inside at, to read, never through a link and never blocking;
 * its descriptor and size, or -1 with a message. */
int ckfs_open(int at, const char *shown, const char *name, int64_t *size, char *err, size_t errlen);
/* Writes the chunks as the regular file `name` inside at: a temporary file made there
 * (O_EXCL, no link followed), fsync'ed, then renamed over name; a name that holds
 * anything but a regular file is an error, and on any failure the temporary file goes
 * and name is untouched. 0, or -1 with a message. */
int ckfs_write(int at, const char *shown, const char *name, const PlanChunk *chunks, int n, char *err, size_t errlen);
/* What name inside at is, without following a link: its st_mode, or 0 when nothing. */
mode_t ckfs_mode(int at, const char *name);
/* Removes name inside at when it is a regular file; a link or anything else stays. */
void ckfs_unlink(int at, const char *name);
/* Whether a name written in a checkpoint is one of its own directory entries: not
 * empty, no '/', not "." or "..". */
int ckfs_plain_name(const char *name);
/* Whether the file system of the directory at has `need` bytes free for this process;
 * 0, or -1 with a message naming what is needed and what is free. */
int ckfs_room(int at, const char *shown, uint64_t need, char *err, size_t errlen);
/* Whether entry is a writer's temporary file, NAME.tmp.PID.N (a killed save's, once no
 * writer of this save runs). */
int ckfs_is_temp(const char *entry);

/* ---- runtime/ckdir.c --------------------------------------------------------------- */

/* The step of a directory entry named step-NNNNNNNN, or -1. */
int64_t ck_step_of(const char *name);
/* "step-NNNNNNNN" into buf. */
const char *ck_step_name(int64_t step, char *buf, size_t n);
/* Rank r's file of a save of generation gen (0 or 1: a save over a committed checkpoint
 * of the same step writes the other one's names); which generation an entry of a step
 * directory is of, or -1 when it is no rank file. */
const char *ck_rank_file(int rank, int gen, char *buf, size_t n);
int ck_generation_of(const char *entry);
/* Whether the step directory `name` inside root (never a link) holds a committed
 * checkpoint: a regular manifest.json. */
int ck_complete(int root, const char *name);
/* The newest complete step inside root, or -1 (with how many incomplete ones); a step
 * entry that is not a directory is an error (-2 with a message). */
int64_t ck_newest(int root, const char *shown, int *incomplete, char *err, size_t errlen);
/* After step `now` is committed: removes the complete checkpoints beyond the newest
 * `keep` (0: keep all) and the incomplete ones older than now, never through a link. */
void ck_prune(int root, int64_t now, int keep);
/* In the step directory at: removes the rank files of generation `gen` (all of them when
 * gen is -1) and the temporary files; the manifest is not touched. */
void ck_remove_files(int at, int gen);

/* ---- runtime/checkpoint.c: an open checkpoint, for ckexport.c ---------------------- */

/* One piece of a logical tensor, as the files hold it. */
typedef struct {
    const char *name;        // the logical tensor
    RtStateKind kind;
    PlanDType dtype;
    int rank;
    int64_t shape[PLAN_MAX_RANK];
    int64_t first, count;
    int32_t file;
    const char *key;         // its name in the file
    uint64_t begin, end;     // its bytes in the file
    uint32_t crc;
} CkPiece;

struct RtCheckpoint {
    char dir[4096];          // the step's directory
    int64_t step;
    uint64_t seed;
    json_t *manifest;
    StFile **files;
    json_t **meta;           // each file's "fsexec" metadata
    int32_t n_files;
    uint64_t *ident;         // (st_dev, st_ino) of the manifest, then of each file: rt_checkpoint_holds
    CkPiece *pieces;         // by (name, first)
    int32_t n_pieces;
};

/* "DIR/FILE: what" into err, for file f of c; -1. */
int ck_fail_file(const RtCheckpoint *c, int32_t f, char *err, size_t errlen, const char *what);

#endif
