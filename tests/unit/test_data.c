/* tests/unit/test_data.c: what fsexec is fed from files, judged before it is used: token
 * files told apart (llm.c's, raw uint16, and what is neither: a damaged llm.c header, a
 * .npy file, a text, an odd size), tokens outside the vocab named by position, and
 * loaded weights with NaN or Inf named by tensor and element (F32, F16, BF16).
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"
#include "tmpdir.h"

enum { MAGIC = 20240520, HEADER = 1024, N_TOK = 500 };

static uint8_t file[HEADER + 2 * N_TOK + 1];

/* An llm.c file of N_TOK tokens below 50257 (GPT-2's vocab) into `file`; its length. */
static size_t llmc(uint32_t magic, uint32_t version, uint32_t count)
{
    memset(file, 0, HEADER);
    uint32_t h[3] = {magic, version, count};
    memcpy(file, h, sizeof h);
    uint32_t x = 12345;
    for (int i = 0; i < N_TOK; i++) {
        x = x * 1664525u + 1013904223u;
        uint16_t t = (uint16_t)((x >> 8) % 50257);
        memcpy(file + HEADER + 2 * i, &t, 2);
    }
    return HEADER + 2 * N_TOK;
}

static void expect_error(const void *buf, size_t len, RtTokenFormat format, const char *want)
{
    RtTokens t;
    char err[512] = "";
    cr_assert_eq(rt_tokens_parse_as(buf, len, format, &t, err, sizeof err), -1, "accepted, want '%s'", want);
    cr_assert_not_null(strstr(err, want), "got '%s', want '%s'", err, want);
}

static void expect_tokens(const void *buf, size_t len, RtTokenFormat format, RtTokenFormat want, int64_t n)
{
    RtTokens t;
    char err[512] = "";
    cr_assert_eq(rt_tokens_parse_as(buf, len, format, &t, err, sizeof err), 0, "%s", err);
    cr_assert_eq(t.format, want);
    cr_assert_eq(t.n, n);
}

Test(tokens, llmc_file_by_its_exact_magic)
{
    size_t len = llmc(MAGIC, 1, N_TOK);
    expect_tokens(file, len, RT_TOKENS_AUTO, RT_TOKENS_LLMC, N_TOK);
    expect_tokens(file, len, RT_TOKENS_LLMC, RT_TOKENS_LLMC, N_TOK);
    expect_error(file, 600, RT_TOKENS_AUTO, "an llm.c token file cut short: 600 bytes");
    llmc(MAGIC, 2, N_TOK);
    expect_error(file, len, RT_TOKENS_AUTO, "version 2");
}

Test(tokens, damaged_magic_is_an_error_not_raw_tokens)
{
    size_t len = llmc(0, 1, N_TOK);
    expect_error(file, len, RT_TOKENS_AUTO, "looks like an llm.c token file with a damaged header: its magic is 0, "
                 "not 20240520; its version is 1; its count, 500 tokens, fits the file's size; the rest of its "
                 "header is zero");
    expect_error(file, len, RT_TOKENS_AUTO, "pass --data-format raw");
    expect_error(file, len, RT_TOKENS_LLMC, "damaged header");
    expect_tokens(file, len, RT_TOKENS_RAW, RT_TOKENS_RAW, (int64_t)len / 2);  // told: the header is read as tokens

    for (int bit = 0; bit < 32; bit++) {
        llmc(MAGIC ^ (1u << bit), 1, N_TOK);
        expect_error(file, len, RT_TOKENS_AUTO, "(1 bit differs)");
        expect_tokens(file, len, RT_TOKENS_RAW, RT_TOKENS_RAW, (int64_t)len / 2);
    }
    llmc(0x88D83401u, 1, N_TOK);  // the magic (0x0134D888) written big-endian
    expect_error(file, len, RT_TOKENS_AUTO, "byte-swapped");
}

Test(tokens, each_sign_of_a_damaged_header_alone)
{
    /* The count fits the size, nothing else does. */
    size_t len = llmc(0xDEADBEEFu, 77, N_TOK);
    memset(file + 12, 0x55, HEADER - 12);
    expect_error(file, len, RT_TOKENS_AUTO, "its count, 500 tokens, fits the file's size");
    /* llm.c's zeroed header tail, nothing else. */
    llmc(0xDEADBEEFu, 77, 3);
    expect_error(file, len, RT_TOKENS_AUTO, "the rest of its header is zero");
    /* A magic two bits off, nothing else. */
    llmc(MAGIC ^ 0x00010001u, 77, 3);
    memset(file + 12, 0x55, HEADER - 12);
    expect_error(file, len, RT_TOKENS_AUTO, "its magic is 20306057, not 20240520 (2 bits differ)");
}

Test(tokens, raw_tokens_pass_auto)
{
    /* Real tokens (any vocab) without a header show no sign of anything else. */
    uint32_t x = 1;
    for (int seed = 0; seed < 300; seed++) {
        uint16_t tok[2000];
        uint32_t vocab = seed % 3 == 0 ? 256 : seed % 3 == 1 ? 50257 : 65536;
        for (int i = 0; i < 2000; i++) x = x * 1664525u + 1013904223u, tok[i] = (uint16_t)((x >> 8) % vocab);
        expect_tokens(tok, sizeof tok, RT_TOKENS_AUTO, RT_TOKENS_RAW, 2000);
    }
    uint16_t few[3] = {5, 6, 7};
    expect_tokens(few, sizeof few, RT_TOKENS_AUTO, RT_TOKENS_RAW, 3);
    expect_error(few, 5, RT_TOKENS_AUTO, "odd size, 5 bytes");
    expect_error(few, 5, RT_TOKENS_RAW, "need an even size");
    expect_error(few, 0, RT_TOKENS_AUTO, "no tokens");
    expect_error(few, sizeof few, RT_TOKENS_LLMC, "not an llm.c token file (--data-format llmc): it starts with");
}

Test(tokens, npy_and_text_say_what_they_are)
{
    static const char npy[] = "\x93NUMPY\x01\x00\x76\x00{'descr': '<u2', 'fortran_order': False, 'shape': (8,), }"
                              "                                          \n";
    uint8_t buf[256] = {0};
    memcpy(buf, npy, sizeof npy - 1);
    expect_error(buf, 128, RT_TOKENS_AUTO,
                 "a NumPy .npy file (dtype '<u2', shape (8,)), not a token file: convert it with "
                 "np.asarray(np.load(path), np.uint16).tofile(");
    expect_error(buf, 9, RT_TOKENS_AUTO, "a NumPy .npy file, not a token file");  // cut short: no dict
    expect_tokens(buf, 128, RT_TOKENS_RAW, RT_TOKENS_RAW, 64);

    static const char text[] = "# Notes\nThe quick brown fox jumps over the lazy dog.\n\tindented, and \"quoted\".\n";
    expect_error(text, sizeof text - 1, RT_TOKENS_AUTO, "a text file (it starts \"# Notes\"), not a token file: "
                 "tokenize it first");
    expect_error(text, sizeof text - 1, RT_TOKENS_AUTO, "built-in byte-level corpus");
    expect_error(text, sizeof text - 1, RT_TOKENS_LLMC, "a text file");
    static const char utf8[] = "Grüße aus Köln, naïve café, 東京 — ok\n";
    expect_error(utf8, sizeof utf8 - 1, RT_TOKENS_AUTO, "a text file (it starts \"Gr\")");
    expect_error("abc", 3, RT_TOKENS_AUTO, "not a token file");
}

Test(tokens, out_of_range_names_position_and_value)
{
    char err[512];
    size_t len = llmc(MAGIC, 1, N_TOK);
    for (int i = 0; i < N_TOK; i++) {
        uint16_t v = (uint16_t)(i % 200);
        memcpy(file + HEADER + 2 * i, &v, 2);
    }
    RtTokens t;
    cr_assert_eq(rt_tokens_parse(file, len, &t, err, sizeof err), 0, "%s", err);
    cr_assert_eq(rt_tokens_check(&t, 200, err, sizeof err), 0, "%s", err);
    uint16_t big = 8227, top = 9000;
    memcpy(file + HEADER + 2 * 5, &big, 2);
    memcpy(file + HEADER + 2 * 300, &top, 2);
    cr_assert_eq(rt_tokens_check(&t, 8000, err, sizeof err), -1);
    cr_assert_not_null(strstr(err, "token 5 is 8227, outside the model's vocab of 8000 (V): byte offset 1034 of "
                              "the file; its largest token is 9000, so it needs a vocab of at least 9001"), "%s", err);
    RtTokens raw = {(const uint16_t *)(file + HEADER), N_TOK, RT_TOKENS_RAW};
    cr_assert_eq(rt_tokens_check(&raw, 8000, err, sizeof err), -1);
    cr_assert_not_null(strstr(err, "token 5 is 8227, outside the model's vocab of 8000 (V): byte offset 10 "), "%s",
                       err);
}

/* ---- loaded weights: NaN and Inf ------------------------------------------------------ */

/* One tensor `name` of dtype dt and the shape written, then read back into a buffer of
 * sentinel bytes; the read's status, err its message, and whether the buffer stayed. */
static int round_trip(PlanDType dt, int rank, const int64_t *shape, const void *data, size_t bytes, char *err,
                      size_t errlen, int *untouched)
{
    char path[400];
    snprintf(path, sizeof path, "%s/w.safetensors", tmpdir);
    StEntry w = {"h.0.attn.w", dt, rank, shape, (void *)data};
    cr_assert_eq(rt_st_write(path, &w, 1, 0, err, errlen), 0, "%s", err);
    uint8_t back[256];
    memset(back, 0xA5, sizeof back);
    StEntry r = {"h.0.attn.w", dt, rank, shape, back};
    int rc = rt_st_read(path, &r, 1, err, errlen);
    *untouched = 1;
    for (size_t i = 0; i < bytes; i++) *untouched &= back[i] == 0xA5;
    return rc;
}

Test(weights, nan_and_inf_named_by_tensor_and_element, .init = make_tmpdir, .fini = remove_tmpdir)
{
    char err[512];
    int untouched;
    int64_t s23[2] = {2, 3}, s4[1] = {4}, s222[3] = {2, 2, 2};
    float f[6] = {1, 2, 3, 4, 5, 6};
    cr_assert_eq(round_trip(PLAN_DT_F32, 2, s23, f, sizeof f, err, sizeof err, &untouched), 0, "%s", err);
    cr_assert(!untouched, "a good file was not read");

    uint32_t nan32 = 0x7fc00001u, inf32 = 0xff800000u;
    memcpy(&f[4], &nan32, 4);
    cr_assert_eq(round_trip(PLAN_DT_F32, 2, s23, f, sizeof f, err, sizeof err, &untouched), -1);
    cr_assert_not_null(strstr(err, "w.safetensors: tensor 'h.0.attn.w' has NaN at index 4 (row 1, column 1); the "
                              "weights are damaged"), "%s", err);
    cr_assert(untouched, "damaged weights were copied before the check");
    memcpy(&f[4], &inf32, 4);
    cr_assert_eq(round_trip(PLAN_DT_F32, 2, s23, f, sizeof f, err, sizeof err, &untouched), -1);
    cr_assert_not_null(strstr(err, "has -Inf at index 4 (row 1, column 1)"), "%s", err);

    uint16_t h[4] = {0x3c00, 0x7bff, 0x7c00, 0x3c00};  // f16: 1, 65504 (the largest finite), +Inf
    cr_assert_eq(round_trip(PLAN_DT_F16, 1, s4, h, sizeof h, err, sizeof err, &untouched), -1);
    cr_assert_not_null(strstr(err, "tensor 'h.0.attn.w' has +Inf at index 2; the weights"), "%s", err);
    h[2] = 0x7e00;
    cr_assert_eq(round_trip(PLAN_DT_F16, 1, s4, h, sizeof h, err, sizeof err, &untouched), -1);
    cr_assert_not_null(strstr(err, "has NaN at index 2"), "%s", err);
    h[2] = 0xfbff;
    cr_assert_eq(round_trip(PLAN_DT_F16, 1, s4, h, sizeof h, err, sizeof err, &untouched), 0, "%s", err);

    uint16_t bf[8] = {0x3f80, 0x7f7f, 0, 0x8000, 0x0001, 0x3f80, 0x3f80, 0xff80};  // bf16: ..., -Inf last
    cr_assert_eq(round_trip(PLAN_DT_BF16, 3, s222, bf, sizeof bf, err, sizeof err, &untouched), -1);
    cr_assert_not_null(strstr(err, "has -Inf at index 7 (at [1, 1, 1])"), "%s", err);
    bf[7] = 0x7fc1;
    cr_assert_eq(round_trip(PLAN_DT_BF16, 3, s222, bf, sizeof bf, err, sizeof err, &untouched), -1);
    cr_assert_not_null(strstr(err, "has NaN at index 7"), "%s", err);

    int32_t ints[4] = {0x7f800000, 0x7fc00000, -1, 0};  // integers are not floats
    cr_assert_eq(round_trip(PLAN_DT_I32, 1, s4, ints, sizeof ints, err, sizeof err, &untouched), 0, "%s", err);
}

/* The first bad element is found wherever it lies in a large tensor. */
Test(weights, nan_found_anywhere_in_a_large_tensor, .init = make_tmpdir, .fini = remove_tmpdir)
{
    enum { R = 300, C = 70 };  // more than one 4096-element block
    static float w[R * C], back[R * C];
    int64_t shape[2] = {R, C};
    char path[400], err[512];
    snprintf(path, sizeof path, "%s/big.safetensors", tmpdir);
    for (int64_t at = 0; at < R * C; at += 4099) {
        for (int i = 0; i < R * C; i++) w[i] = (float)i * 1e-3f;
        uint32_t nan = 0x7f800001u;
        memcpy(&w[at], &nan, 4);
        if (at + 5000 < R * C) memcpy(&w[at + 5000], &nan, 4);  // a later one is not the first
        StEntry e = {"wte", PLAN_DT_F32, 2, shape, w}, r = {"wte", PLAN_DT_F32, 2, shape, back};
        cr_assert_eq(rt_st_write(path, &e, 1, 0, err, sizeof err), 0, "%s", err);
        cr_assert_eq(rt_st_read(path, &r, 1, err, sizeof err), -1);
        char want[128];
        snprintf(want, sizeof want, "tensor 'wte' has NaN at index %lld (row %lld, column %lld)", (long long)at,
                 (long long)(at / C), (long long)(at % C));
        cr_assert_not_null(strstr(err, want), "got '%s', want '%s'", err, want);
    }
}

/* ---- .npy files (runtime/npy.c) ------------------------------------------------------ */

/* A .npy file of version `major` holding `body` (n bytes) under the header dict `dict`. */
static size_t npy_file(uint8_t *out, int major, const char *dict, const void *body, size_t n)
{
    size_t pre = major == 1 ? 10 : 12, hl = strlen(dict) + 1;
    hl += (64 - (pre + hl) % 64) % 64;
    memcpy(out, "\x93NUMPY", 6);
    out[6] = (uint8_t)major, out[7] = 0;
    for (size_t k = 0; k < pre - 8; k++) out[8 + k] = (uint8_t)(hl >> (8 * k));
    memset(out + pre, ' ', hl);
    memcpy(out + pre, dict, strlen(dict));
    out[pre + hl - 1] = '\n';
    memcpy(out + pre + hl, body, n);
    return pre + hl + n;
}

Test(data, npy_reads_f8_and_i8_and_refuses_every_truncation)
{
    static uint8_t buf[512];
    double x[6] = {1.5, -2.25, 3, 0.1, 1e30, -0.0};
    size_t len = npy_file(buf, 2, "{'descr': '<f8', 'fortran_order': False, 'shape': (3, 2), }", x, sizeof x);
    RtArray a;
    char err[512];
    cr_assert_eq(rt_npy_parse(buf, len, &a, err, sizeof err), 0, "%s", err);
    cr_expect_eq(a.dtype, PLAN_DT_F32);
    cr_expect(a.rank == 2 && a.shape[0] == 3 && a.shape[1] == 2 && a.numel == 6);
    for (int i = 0; i < 6; i++) cr_expect_eq(((float *)a.data)[i], (float)x[i], "element %d", i);
    rt_npy_free(&a);
    for (size_t n = 0; n < len; n++) cr_expect_eq(rt_npy_parse(buf, n, &a, err, sizeof err), -1, "a file cut at %zu bytes", n);

    int64_t big[2] = {7, (int64_t)1 << 31};
    len = npy_file(buf, 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", big, sizeof big);
    cr_expect_eq(rt_npy_parse(buf, len, &a, err, sizeof err), -1);
    cr_expect(strstr(err, "element 1 is 2147483648, outside int32's range"), "%s", err);
    big[1] = -3;
    len = npy_file(buf, 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", big, sizeof big);
    cr_assert_eq(rt_npy_parse(buf, len, &a, err, sizeof err), 0, "%s", err);
    cr_expect(a.dtype == PLAN_DT_I32 && ((int32_t *)a.data)[0] == 7 && ((int32_t *)a.data)[1] == -3);
    rt_npy_free(&a);

    double huge = 1e300;
    len = npy_file(buf, 3, "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }", &huge, sizeof huge);
    cr_expect_eq(rt_npy_parse(buf, len, &a, err, sizeof err), -1);
    cr_expect(strstr(err, "outside float32's range"), "%s", err);
    static const char *const bad[] = {
        "{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }",   // Fortran order
        "{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }",  // big-endian
        "{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }",  // another dtype
        "{'descr': '<f4', 'shape': (1,), }",                          // a key missing
        "{'descr': '<f4', 'fortran_order': False, 'shape': (1, x), }", // a shape that does not parse
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",   // 4 bytes for 2 elements
    };
    float one = 1;
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        len = npy_file(buf, 1, bad[k], &one, sizeof one);
        cr_expect_eq(rt_npy_parse(buf, len, &a, err, sizeof err), -1, "%s", bad[k]);
    }
}
