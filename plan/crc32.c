/* plan/crc32.c: CRC-32 as zlib, PNG and gzip compute it (reflected polynomial
 * 0xEDB88320, initial and final XOR 0xFFFFFFFF), so `crc32` tools agree with the plan's
 * section table. Slicing by 8 (eight 256-entry tables, made once before main by a
 * constructor, so no thread ever sees them half made) takes eight bytes a step: a
 * plan with its CUDA program is written and read without the checksum showing. Also
 * FNV-1a 64, the non-cryptographic hash of cache keys and param names. */
#include "plan.h"

static uint32_t T[8][256];

__attribute__((constructor)) static void make_tables(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0xedb88320u : c >> 1;
        T[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (int i = 0; i < 256; i++) T[t][i] = (T[t - 1][i] >> 8) ^ T[0][T[t - 1][i] & 0xff];
}

uint32_t plan_crc32(uint32_t crc, const void *buf, size_t n)
{
    const unsigned char *p = buf;
    crc = ~crc;
    for (; n >= 8; n -= 8, p += 8) {  // the bytes as two little-endian words, whatever the host
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
        crc = T[7][lo & 0xff] ^ T[6][lo >> 8 & 0xff] ^ T[5][lo >> 16 & 0xff] ^ T[4][lo >> 24] ^ T[3][hi & 0xff] ^
              T[2][hi >> 8 & 0xff] ^ T[1][hi >> 16 & 0xff] ^ T[0][hi >> 24];
    }
    for (; n; n--, p++) crc = (crc >> 8) ^ T[0][(crc ^ *p) & 0xff];
    return ~crc;
}

uint64_t plan_fnv1a(uint64_t h, const void *buf, size_t n)
{
    const unsigned char *s = buf;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    return h;
}
