/* tests/unit/test_cast.c: the CPU backend's 16-bit floats equal PyTorch's bit for bit.
 * PyTorch (Debian's python3-torch, /usr/bin/python3) converts 2 million random f32 bit
 * patterns, every pattern around the f16 subnormal, normal and overflow boundaries, and
 * the specials, with .half() and .bfloat16(); our conversions must give the same bits,
 * and f16 -> f32 must be exact. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels.h"

static const char *SCRIPT =
    "import numpy as np, torch, sys\n"
    "rng = np.random.default_rng(7)\n"
    "u = rng.integers(0, 2**32, size=2_000_000, dtype=np.uint64).astype(np.uint32)\n"
    "edge = np.arange(0x33000000 - 4096, 0x477ff000 + 8192, 61, dtype=np.uint32)\n"
    "spec = np.array([0, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0x7f7fffff, 0x00000001], dtype=np.uint32)\n"
    "u = np.concatenate([u, edge, edge | 0x80000000, spec])\n"
    "t = torch.from_numpy(u.view(np.float32).copy())\n"
    "h = t.half().view(torch.int16).numpy().view(np.uint16)\n"
    "b = t.bfloat16().view(torch.int16).numpy().view(np.uint16)\n"
    "f = torch.from_numpy(h.view(np.int16).copy()).view(torch.float16).float().numpy()\n"
    "out = open(sys.argv[1], 'wb')\n"
    "np.array([len(u)], dtype=np.uint64).tofile(out)\n"
    "u.tofile(out); h.tofile(out); b.tofile(out); f.tofile(out)\n";

Test(cast, f16_and_bf16_equal_pytorch_bit_for_bit)
{
    char path[] = "/tmp/fs_cast.XXXXXX", script[] = "/tmp/fs_cast_py.XXXXXX";
    int fd = mkstemp(path), sfd = mkstemp(script);
    cr_assert(fd >= 0 && sfd >= 0);
    FILE *s = fdopen(sfd, "w");
    fputs(SCRIPT, s);
    fclose(s);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s %s", script, path);
    cr_assert_eq(system(cmd), 0, "PyTorch (python3-torch under /usr/bin/python3) is needed: %s", cmd);
    FILE *f = fdopen(fd, "rb");
    uint64_t n;
    cr_assert_eq(fread(&n, 8, 1, f), 1);
    uint32_t *u = malloc(4 * n);
    uint16_t *h = malloc(2 * n), *b = malloc(2 * n);
    float *back = malloc(4 * n);
    cr_assert(fread(u, 4, n, f) == n && fread(h, 2, n, f) == n && fread(b, 2, n, f) == n && fread(back, 4, n, f) == n);
    fclose(f);
    size_t bad_h = 0, bad_b = 0, bad_back = 0;
    for (uint64_t i = 0; i < n; i++) {
        float x;
        memcpy(&x, &u[i], 4);
        uint16_t mh = cpu_f32_to_f16(x), mb = cpu_f32_to_bf16(x);
        if (isnan(x)) {
            /* NaN payloads are not part of the contract, NaN-ness is. */
            bad_h += !isnan(cpu_f16_to_f32(mh));
            bad_b += !isnan(cpu_bf16_to_f32(mb));
            continue;
        }
        bad_h += mh != h[i];
        bad_b += mb != b[i];
        float r = cpu_f16_to_f32(h[i]);
        bad_back += memcmp(&r, &back[i], 4) != 0;
    }
    cr_expect_eq(bad_h, 0, "%zu of %lu f32 -> f16 conversions differ from torch's .half()", bad_h, (unsigned long)n);
    cr_expect_eq(bad_b, 0, "%zu of %lu f32 -> bf16 conversions differ from torch's .bfloat16()", bad_b, (unsigned long)n);
    cr_expect_eq(bad_back, 0, "%zu f16 -> f32 conversions differ", bad_back);
    free(u), free(h), free(b), free(back);
    unlink(path), unlink(script);
}
