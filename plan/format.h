/* plan/format.h: the byte layout of a plan file, private to plan/ (read.c and write.c).
 * plan.h describes the header; this file lists the sections and their records.
 *
 * Sections, in the order the writer puts them; all but CUDA and CUMD are required:
 *
 *   STRS  u32 count, then count x { u32 len, len bytes (no NUL) }
 *   META  records { i32 key, u8 kind, 3 pad, 8-byte value: i64, f64 bits, or i32 string }
 *   BLKS  records { i32 name, i32 layer, i32 index }
 *   TENS  records { i32 name, u8 dtype, u8 role, u8 place, u8 init, u8 rank, 3 pad,
 *                   i32 block, i32 producer, i32 tied_to, f64 init_a, f64 init_b,
 *                   i64 shape[6], i32 grad, i32 live_start, i32 live_end, i32 alias,
 *                   i64 offset, i64 rank_stride, i64 flat_offset, i32 unit, u8 sharded,
 *                   u8 step_role, 2 pad, i64 logical_rows (2.2) }
 *   NODE  records { i32 op (string), i32 block, u8 phase, u8 stream, 2 pad, i32 line,
 *                   i32 col, i32 in, i32 n_in, i32 out, i32 n_out, i32 attr, i32 n_attr,
 *                   i32 wait, i32 n_wait (range in WAIT), i32 microbatch, f64 flops }
                                                   (microbatch at byte 52, flops at 56: 64 bytes)
 *   IDS   u32 count, then count x i32 (tensor ids)
 *   ATTR  records { i32 key, u8 kind, 3 pad, 8-byte value: i64, f64 bits, or
 *                   i32 list, i32 n_list (range in INTS) }
 *   INTS  u32 count, then count x i64
 *   OUTS  u32 count, then count x i32 (tensor ids)
 *   WAIT  u32 count, then count x i32 (op ids: what each op waits for)
 *   CUDA  records { i32 op, u8 kind, 3 pad, i32 kernel (string), i32 args, i32 n_args,
 *                   i32 grid[3], i32 block[3], i32 smem, i32 ta, i32 tb,
 *                   i64 m, n, k, lda, ldb, ldc, stride_a, stride_b, stride_c, batch,
 *                   a_off, b_off, c_off }          (byte offsets 0, 4, 8, 12, 16, 20, 32,
 *                   44, 48, 52, then the i64s from 56 on, 8 bytes apart: 160 bytes)
 *         the CUDA program (PlanCuda in plan.h), sorted by op; args is a range in IDS
 *   PROG  records { i32 stage, i32 dp_world, i32 first_op, i32 n_ops,
 *                   i64 space_bytes[2] (device, host), i32 first_tensor, i32 n_tensors,
 *                   i32 first_output, i32 n_outputs, i64 module_at, i64 module_len }
 *                                                  (the i64s at bytes 16, 24, 48, 56: 64 bytes)
 *   CUMD  u32 length, then the CUDA module's text (no NUL); length 0: none
 *   EVAL  the evaluation program: a whole plan file of one program (its own sections,
 *         checksums and memory plan), written only when the plan has one
 *   SAMP  the sampling program, the same way
 *   DECO  the decode program (one token at a position, with KV caches), the same way
 *
 * "records" means: u32 count, u32 record size, then count records of that size. A reader
 * needs at least the size its version knows (a 2.0 file: 2.0's sizes; 2.1 or later: 2.1's)
 * and skips the rest of each record, so a later minor version may append fields. A 2.0
 * file reads with 2.1's fields at their defaults: no micro-batch (-1), 0 FLOPs, and its
 * one program's ranges over every tensor, every output and the whole module; a 2.0 or 2.1
 * file with 2.2's: no tensor padded (logical_rows 0). Absent ids (PLAN_NONE) are stored as -1.
 */
#ifndef FS_PLAN_FORMAT_H
#define FS_PLAN_FORMAT_H

#include <stdint.h>
#include <string.h>

#define PLAN_MAGIC "\x89" "FSP\r\n\x1a\n"
enum {
    PLAN_MAGIC_LEN = 8,
    PLAN_HEADER_SIZE = 32,      // magic, version, counts, size, crc, reserved
    PLAN_ENTRY_SIZE = 24,       // one section table entry
    PLAN_HEADER_CRC_AT = 24,    // where the header CRC sits (read as zero when computed)
};

/* The sections, in file order: id, tag, and whether a reader requires it. */
#define PLAN_SECTIONS(X)    \
    X(STRS, "STRS", 1)      \
    X(META, "META", 1)      \
    X(BLKS, "BLKS", 1)      \
    X(TENS, "TENS", 1)      \
    X(NODE, "NODE", 1)      \
    X(IDS, "IDS ", 1)       \
    X(ATTR, "ATTR", 1)      \
    X(INTS, "INTS", 1)      \
    X(OUTS, "OUTS", 1)      \
    X(WAIT, "WAIT", 1)      \
    X(PROG, "PROG", 1)      \
    X(CUDA, "CUDA", 0)      \
    X(CUMD, "CUMD", 0)      \
    X(EVAL, "EVAL", 0)      \
    X(SAMP, "SAMP", 0)      \
    X(DECO, "DECO", 0)

typedef enum {
#define X(id, tag, required) SEC_##id,
    PLAN_SECTIONS(X)
#undef X
    SEC_COUNT
} SectionId;

/* Record sizes of version 2.2: what the writer writes and the least a 2.2 reader accepts. */
enum {
    REC_META = 16,
    REC_BLKS = 12,
    REC_TENS = 144,
    REC_NODE = 64,
    REC_ATTR = 16,
    REC_CUDA = 160,
    REC_PROG = 64,
};
/* Version 2.0's NODE (no micro-batch, no FLOPs) and PROG (no tensor, output or module
 * ranges: a 2.0 plan has at most one program, which holds everything). */
enum { REC_NODE_2_0 = 52, REC_PROG_2_0 = 32 };
/* Version 2.1's TENS and earlier (no logical rows: nothing padded). */
enum { REC_TENS_2_1 = 136 };

/* ---- little-endian encoding, byte by byte, whatever the host --------------------- */

static inline void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t get_u64(const uint8_t *p) { return get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }

static inline uint64_t f64_bits(double f)
{
    uint64_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static inline double bits_f64(uint64_t u)
{
    double f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif
