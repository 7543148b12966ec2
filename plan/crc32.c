/* plan/crc32.c: CRC-32 as zlib, PNG and gzip compute it (reflected polynomial
 * 0xEDB88320, initial and final XOR 0xFFFFFFFF), so `crc32` tools agree with the plan's
 * section table. A nibble table keeps it short; plans are checked once per load. */
#include "plan.h"

static const uint32_t NIBBLE[16] = {
    0x00000000, 0x1db71064, 0x3b6e20c8, 0x26d930ac, 0x76dc4190, 0x6b6b51f4, 0x4db26158, 0x5005713c,
    0xedb88320, 0xf00f9344, 0xd6d6a3e8, 0xcb61b38c, 0x9b64c2b0, 0x86d3d2d4, 0xa00ae278, 0xbdbdf21c,
};

uint32_t plan_crc32(uint32_t crc, const void *buf, size_t n)
{
    const unsigned char *p = buf;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        crc = (crc >> 4) ^ NIBBLE[crc & 15];
        crc = (crc >> 4) ^ NIBBLE[crc & 15];
    }
    return ~crc;
}
